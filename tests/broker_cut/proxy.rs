//! A TCP relay in front of the broker whose connections can be cut, each side reset (`SO_LINGER`
//! 0), as a broker node's death resets the connections on it: the pipeline reads "connection
//! reset by peer", and the broker sees those clients gone and takes their unacked messages back.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The relay; dropped, it stops accepting and cuts what it relays.
pub struct CutProxy {
    addr: SocketAddr,
    /// Each connection relayed so far, by the order it came in, and what cuts it.
    relayed: Arc<Mutex<Vec<CancellationToken>>>,
    stop: CancellationToken,
}

impl CutProxy {
    /// Relays connections made to the returned proxy's address to `upstream`.
    pub async fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let relayed: Arc<Mutex<Vec<CancellationToken>>> = Arc::default();
        let stop = CancellationToken::new();
        let (cuts, stopped) = (relayed.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stopped.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let cut = CancellationToken::new();
                cuts.lock().unwrap().push(cut.clone());
                tokio::spawn(relay(client, upstream, cut));
            }
        });
        CutProxy { addr, relayed, stop }
    }

    /// An AMQP URL for the default vhost through the relay.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.addr)
    }

    /// Resets the connections relayed so far whose place in the order of arrival `which` picks
    /// (those already cut stay cut); new ones are relayed as before. Returns how many it cut.
    pub fn cut(&self, which: impl Fn(usize) -> bool) -> usize {
        let relayed = self.relayed.lock().unwrap();
        let live = relayed.iter().enumerate().filter(|(i, cut)| which(*i) && !cut.is_cancelled());
        live.map(|(_, cut)| cut.cancel()).count()
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cut(|_| true);
    }
}

async fn relay(mut client: TcpStream, upstream: SocketAddr, cut: CancellationToken) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        cut.cancel();
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    tokio::select! {
        _ = cut.cancelled() => {}
        _ = copy_bidirectional(&mut client, &mut server) => {
            // Ended on its own: nothing left to cut.
            cut.cancel();
            return;
        }
    }
    // Closing with a zero linger sends a reset instead of a FIN, on both sides.
    let _ = (client.set_zero_linger(), server.set_zero_linger());
}
