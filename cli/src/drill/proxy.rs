//! A TCP proxy on loopback in front of the drill's broker, with a switch
//! that cuts the link the way row #2 of docs/architecture.md §13.5 wants
//! it: the request reaches the broker and is stored, the reply never comes
//! back
//! (docs/architecture.md §6: the send's outcome is unknown, the scanner
//! re-sends with the same `message_id`, the inbox absorbs the duplicate).

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The state of the link through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Bytes flow both ways.
    Up,
    /// Requests still reach the broker; its replies are dropped.
    RepliesLost,
    /// Every connection is closed, and new ones are closed at once.
    Down,
}

pub struct Proxy {
    link: watch::Sender<Link>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `front` and forwards every connection to `back`.
    pub async fn start(front: SocketAddr, back: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(front).await?;
        let (link, watcher) = watch::channel(Link::Up);
        let task = tokio::spawn(accept_loop(listener, back, watcher));
        Ok(Self { link, task })
    }

    pub fn set(&self, link: Link) {
        self.link.send_replace(link);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.set(Link::Down);
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, back: SocketAddr, link: watch::Receiver<Link>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *link.borrow() == Link::Down {
            drop(client);
            continue;
        }
        tokio::spawn(pipe(client, back, link.clone()));
    }
}

/// One connection: client bytes always go up; broker bytes come back only
/// while the link is up; the connection closes when the link goes down.
async fn pipe(mut client: TcpStream, back: SocketAddr, mut link: watch::Receiver<Link>) {
    let Ok(mut server) = TcpStream::connect(back).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        tokio::select! {
            n = client.read(&mut up) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if server.write_all(&up[..n]).await.is_err() { return },
            },
            n = server.read(&mut down) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if *link.borrow() == Link::Up && client.write_all(&down[..n]).await.is_err() {
                        return;
                    }
                }
            },
            changed = link.changed() => {
                if changed.is_err() || *link.borrow() == Link::Down {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn free_port() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
    }

    async fn roundtrip(c: &mut TcpStream) -> Option<Vec<u8>> {
        c.write_all(b"ping").await.ok()?;
        let mut b = [0u8; 4];
        match tokio::time::timeout(std::time::Duration::from_millis(300), c.read_exact(&mut b))
            .await
        {
            Ok(Ok(_)) => Some(b.to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn forwards_then_loses_replies_then_closes() {
        let back = echo_server().await;
        let front = free_port().await;
        let proxy = Proxy::start(front, back).await.unwrap();
        let mut c = TcpStream::connect(front).await.unwrap();
        assert_eq!(roundtrip(&mut c).await.as_deref(), Some(&b"ping"[..]));

        proxy.set(Link::RepliesLost);
        assert_eq!(roundtrip(&mut c).await, None, "the reply must be dropped");

        proxy.set(Link::Down);
        let mut b = [0u8; 4];
        let closed = tokio::time::timeout(std::time::Duration::from_secs(2), c.read(&mut b))
            .await
            .expect("the connection closes when the link goes down");
        assert!(matches!(closed, Ok(0) | Err(_)));

        proxy.set(Link::Up);
        let mut c = TcpStream::connect(front).await.unwrap();
        assert_eq!(roundtrip(&mut c).await.as_deref(), Some(&b"ping"[..]));
    }
}
