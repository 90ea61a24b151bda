//! A TCP relay in front of the broker whose connections can all be cut at once, each side reset
//! (`SO_LINGER` 0), as a broker node's death resets them: the pipeline reads "connection reset
//! by peer", and the broker sees its clients gone and takes their unacked messages back.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The relay; dropped, it stops accepting and cuts what it relays.
pub struct CutProxy {
    addr: SocketAddr,
    /// Cancelled to cut every connection relayed so far; replaced after each cut.
    current: Arc<Mutex<CancellationToken>>,
    stop: CancellationToken,
}

impl CutProxy {
    /// Relays connections made to the returned proxy's address to `upstream`.
    pub async fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let current = Arc::new(Mutex::new(CancellationToken::new()));
        let stop = CancellationToken::new();
        let (cuts, stopped) = (current.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stopped.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else { continue };
                let cut = cuts.lock().unwrap().clone();
                tokio::spawn(relay(client, upstream, cut));
            }
        });
        CutProxy { addr, current, stop }
    }

    /// An AMQP URL for the default vhost through the relay.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.addr)
    }

    /// Resets every connection relayed so far; new ones are relayed as before.
    pub fn cut(&self) {
        let old = std::mem::take(&mut *self.current.lock().unwrap());
        old.cancel();
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cut();
    }
}

async fn relay(mut client: TcpStream, upstream: SocketAddr, cut: CancellationToken) {
    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    tokio::select! {
        _ = cut.cancelled() => {}
        _ = copy_bidirectional(&mut client, &mut server) => return,
    }
    // Closing with a zero linger sends a reset instead of a FIN, on both sides.
    let _ = (client.set_zero_linger(), server.set_zero_linger());
}
