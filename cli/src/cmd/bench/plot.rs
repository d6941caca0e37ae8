//! `bench flash-sale --plot out.svg`: the sale's timeline as one SVG, four
//! panels over the same seconds (docs/architecture.md §11.7):
//! - reservations/s and orders/s;
//! - the order group's backlog in messages;
//! - the same backlog in seconds (the lag alert's figure, §11.2);
//! - end-to-end latency (reservation to order committed) p50, p99, p99.9
//!   of the orders created in each second.
//!
//! SVG, so no font library is needed: the text is `<text>` the viewer sets.
//! [`series`] decides what is drawn (pure); [`draw`] only draws it.

use plotters::prelude::*;
use seckill_engine::SecondFacts;
use std::path::Path;

/// What the bench saw: PostgreSQL's second-by-second facts and the lag
/// samples taken while the sale ran.
#[derive(Debug, Default)]
pub struct Timeline {
    pub seconds: Vec<SecondFacts>,
    /// (seconds since the start, backlog messages, backlog seconds).
    pub backlog: Vec<(f64, i64, f64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot: no reservation reached PostgreSQL and no backlog was sampled")]
    Empty,
    #[error("cannot draw {path}: {detail}")]
    Draw { path: String, detail: String },
}

/// One line of one panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub label: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// One panel: its title, its y-axis and its lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: &'static str,
    pub y: &'static str,
    /// Decimals on the y-axis labels.
    pub decimals: usize,
    pub lines: Vec<Line>,
}

/// The four panels of [`Timeline`]. A per-second figure sits at the
/// middle of its second; a second with no order created has no latency
/// point (a gap, not a zero). Pure.
pub fn series(t: &Timeline) -> Vec<Panel> {
    let mid = |s: &SecondFacts| s.second as f64 + 0.5;
    let count = |f: fn(&SecondFacts) -> i64| -> Vec<(f64, f64)> {
        t.seconds.iter().map(|s| (mid(s), f(s) as f64)).collect()
    };
    let latency = |i: usize| -> Vec<(f64, f64)> {
        t.seconds
            .iter()
            .filter_map(|s| s.end_to_end_ms.map(|p| (mid(s), p[i])))
            .collect()
    };
    vec![
        Panel {
            title: "Throughput",
            decimals: 0,
            y: "per second",
            lines: vec![
                Line {
                    label: "reservations/s",
                    points: count(|s| s.reserved),
                },
                Line {
                    label: "orders/s",
                    points: count(|s| s.orders_created),
                },
            ],
        },
        Panel {
            title: "Backlog (order group)",
            decimals: 0,
            y: "messages",
            lines: vec![Line {
                label: "backlog messages",
                points: t.backlog.iter().map(|&(x, m, _)| (x, m as f64)).collect(),
            }],
        },
        Panel {
            title: "Backlog age (order group)",
            decimals: 1,
            y: "seconds",
            lines: vec![Line {
                label: "backlog seconds",
                points: t.backlog.iter().map(|&(x, _, s)| (x, s)).collect(),
            }],
        },
        Panel {
            title: "End to end: reservation to order committed",
            decimals: 0,
            y: "ms",
            lines: vec![
                Line {
                    label: "p50",
                    points: latency(0),
                },
                Line {
                    label: "p99",
                    points: latency(1),
                },
                Line {
                    label: "p99.9",
                    points: latency(2),
                },
            ],
        },
    ]
}

const COLOURS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
];

/// Writes the panels of `t` to `path` as an SVG, 1000 px wide.
pub fn draw(t: &Timeline, path: &Path) -> Result<(), PlotError> {
    let panels = series(t);
    let all = || panels.iter().flat_map(|p| &p.lines).flat_map(|l| &l.points);
    if all().next().is_none() {
        return Err(PlotError::Empty);
    }
    let x_max = all().map(|p| p.0).fold(1.0, f64::max).ceil();
    let failed = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    let root = SVGBackend::new(path, (1000, 1200)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    for (panel, area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
        let y_max = panel
            .lines
            .iter()
            .flat_map(|l| &l.points)
            .map(|p| p.1)
            .fold(0.0, f64::max);
        // Headroom above the highest point, and a visible axis when flat.
        let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
        let mut chart = ChartBuilder::on(&area)
            .caption(panel.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|e| failed(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds since the sale began")
            .y_desc(panel.y)
            .x_label_formatter(&|x| format!("{x:.1}"))
            .y_label_formatter(&|y| format!("{y:.*}", panel.decimals))
            .draw()
            .map_err(|e| failed(&e))?;
        for (line, colour) in panel.lines.iter().zip(COLOURS.iter().cycle()) {
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    colour.stroke_width(2),
                ))
                .map_err(|e| failed(&e))?
                .label(line.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| failed(&e))?;
    }
    root.present().map_err(|e| failed(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(second: i64, reserved: i64, orders: i64, p: Option<[f64; 3]>) -> SecondFacts {
        SecondFacts {
            second,
            reserved,
            orders_created: orders,
            end_to_end_ms: p,
        }
    }

    fn fixture() -> Timeline {
        Timeline {
            seconds: vec![
                second(0, 4000, 2500, Some([12.0, 80.0, 140.0])),
                second(1, 1000, 2400, Some([30.0, 200.0, 310.0])),
                second(2, 0, 100, None),
            ],
            backlog: vec![(0.25, 0, 0.0), (1.0, 1500, 0.6), (2.5, 0, 0.0)],
        }
    }

    #[test]
    fn each_figure_lands_in_its_panel_and_a_second_without_orders_has_no_latency() {
        let panels = series(&fixture());
        let titles: Vec<_> = panels.iter().map(|p| p.title).collect();
        assert_eq!(
            titles,
            [
                "Throughput",
                "Backlog (order group)",
                "Backlog age (order group)",
                "End to end: reservation to order committed"
            ]
        );
        assert_eq!(
            panels[0].lines[1].points,
            [(0.5, 2500.0), (1.5, 2400.0), (2.5, 100.0)]
        );
        assert_eq!(panels[1].lines[0].points[1], (1.0, 1500.0));
        assert_eq!(panels[2].lines[0].points[1], (1.0, 0.6));
        let p999 = &panels[3].lines[2];
        assert_eq!(p999.label, "p99.9");
        assert_eq!(p999.points, [(0.5, 140.0), (1.5, 310.0)], "second 2: none");
    }

    #[test]
    fn the_plot_is_an_svg_with_every_line_and_its_label() {
        let path = std::env::temp_dir().join(format!("seckill-plot-{}.svg", ulid::Ulid::new()));
        draw(&fixture(), &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg"), "{}", &svg[..60.min(svg.len())]);
        let texts: Vec<&str> = svg
            .split("</text>")
            .filter_map(|chunk| chunk.rsplit_once('>').map(|(_, t)| t.trim()))
            .collect();
        for label in [
            "reservations/s",
            "orders/s",
            "backlog messages",
            "backlog seconds",
            "p50",
            "p99",
            "p99.9",
        ] {
            assert!(texts.contains(&label), "no {label} in {texts:?}");
        }
        assert!(svg.matches("<polyline").count() >= 7, "one line a series");
    }

    #[test]
    fn nothing_to_draw_is_an_error_not_an_empty_picture() {
        let path = std::env::temp_dir().join("seckill-plot-never-written.svg");
        assert!(matches!(
            draw(&Timeline::default(), &path),
            Err(PlotError::Empty)
        ));
        assert!(!path.exists());
    }
}
