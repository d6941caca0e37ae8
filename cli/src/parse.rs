//! Value parsers for flags that clap cannot read by itself: durations
//! (`30s`, `5m`, `250ms`) and rates (`20/s`). A bad value is a usage error
//! that shows the expected form.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error("invalid duration {0:?}: expected e.g. 30s, 5m, 250ms")]
    Duration(String),
    #[error("invalid duration unit in {0:?}: use ms, s, m or h")]
    DurationUnit(String),
    #[error("{0:?} is not a rate; write e.g. 20/s")]
    Rate(String),
}

/// `250ms`, `30s`, `5m`, `1h`; a bare number is seconds.
pub fn duration(s: &str) -> Result<Duration, ArgError> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: u64 = num.parse().map_err(|_| ArgError::Duration(s.to_owned()))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(ArgError::DurationUnit(s.to_owned())),
    }
}

/// `20/s` or `20`: messages per second, positive and finite.
pub fn rate(s: &str) -> Result<f64, ArgError> {
    let n = s.trim().trim_end_matches("/s");
    match n.parse::<f64>() {
        Ok(r) if r > 0.0 && r.is_finite() => Ok(r),
        _ => Err(ArgError::Rate(s.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(duration("x"), Err(ArgError::Duration("x".into())));
        assert_eq!(duration("5d"), Err(ArgError::DurationUnit("5d".into())));
    }

    #[test]
    fn rates() {
        assert_eq!(rate("20/s"), Ok(20.0));
        assert_eq!(rate(" 2.5 "), Ok(2.5));
        assert!(rate("0/s").is_err());
        assert!(rate("inf").is_err());
        assert!(rate("fast").is_err());
    }
}
