//! `amqp-client-probe semantics`: what amqprs does in the cases the broker runtime depends on,
//! each checked against the machine's RabbitMQ and printed as one JSON line. These are the
//! facts a migration from lapin would rest on (README, "What replacing lapin would take").

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use amqprs::callbacks::ChannelCallback;
use amqprs::channel::{
    BasicConsumeArguments, BasicPublishArguments, Channel, ConfirmSelectArguments,
    QueueDeclareArguments, QueueDeleteArguments,
};
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::{Ack, BasicProperties, Cancel, CloseChannel, Nack, Return};
use async_trait::async_trait;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};

type Error = amqprs::error::Error;

/// Records the callbacks a channel gets, in their order.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<String>>>);

#[async_trait]
impl ChannelCallback for Events {
    async fn close(&mut self, _: &Channel, c: CloseChannel) -> Result<(), Error> {
        self.0.lock().unwrap().push(format!("close {c}"));
        Ok(())
    }
    async fn cancel(&mut self, _: &Channel, _: Cancel) -> Result<(), Error> {
        self.0.lock().unwrap().push("cancel".into());
        Ok(())
    }
    async fn flow(&mut self, _: &Channel, active: bool) -> Result<bool, Error> {
        Ok(active)
    }
    async fn publish_ack(&mut self, _: &Channel, a: Ack) {
        self.0.lock().unwrap().push(format!("ack {}", a.delivery_tag()));
    }
    async fn publish_nack(&mut self, _: &Channel, n: Nack) {
        self.0.lock().unwrap().push(format!("nack {}", n.delivery_tag()));
    }
    async fn publish_return(&mut self, _: &Channel, r: Return, _: BasicProperties, _: Vec<u8>) {
        self.0.lock().unwrap().push(format!("return {}", r.reply_code()));
    }
}

fn args(port: u16, name: &str) -> OpenConnectionArguments {
    OpenConnectionArguments::new("127.0.0.1", port, "guest", "guest")
        .heartbeat(5)
        .connection_name(name)
        .finish()
}

async fn channel_with(conn: &Connection, events: &Events) -> anyhow::Result<Channel> {
    let ch = conn.open_channel(None).await?;
    ch.register_callback(events.clone()).await?;
    Ok(ch)
}

fn print(case: &str, value: serde_json::Value) {
    println!("{}", serde_json::json!({ "case": case, "result": value }));
}

pub async fn run() -> anyhow::Result<()> {
    let prefix = format!("probe-sem-{:08x}", rand::random::<u32>());
    let conn = Connection::open(&args(5672, &prefix)).await?;

    // A mandatory publish nobody can route: is its return reported before its ack?
    let events = Events::default();
    let ch = channel_with(&conn, &events).await?;
    ch.confirm_select(ConfirmSelectArguments::default()).await?;
    let to = BasicPublishArguments::new("", &format!("{prefix}.nowhere")).mandatory(true).finish();
    ch.basic_publish(BasicProperties::default(), b"x".to_vec(), to).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    print("unroutable mandatory publish", serde_json::json!(events.0.lock().unwrap().clone()));

    // A declaration the broker refuses (a durable redeclaration of a transient queue).
    let q = format!("{prefix}.transient");
    let ch = conn.open_channel(None).await?;
    ch.queue_declare(QueueDeclareArguments::new(&q).durable(false).finish()).await?;
    let events = Events::default();
    let ch2 = channel_with(&conn, &events).await?;
    let refused = ch2.queue_declare(QueueDeclareArguments::new(&q).durable(true).finish()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    print(
        "refused declaration",
        serde_json::json!({ "error": refused.err().map(|e| e.to_string()),
            "channel_open_after": ch2.is_open(), "connection_open_after": conn.is_open(),
            "callbacks": events.0.lock().unwrap().clone() }),
    );

    // The queue of a consumer deleted under it: does the consumer's stream end?
    let events = Events::default();
    let cch = channel_with(&conn, &events).await?;
    let consume = BasicConsumeArguments::new(&q, "").manual_ack(true).finish();
    let (_, mut rx) = cch.basic_consume_rx(consume).await?;
    ch.queue_delete(QueueDeleteArguments::new(&q)).await?;
    let t = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(15), rx.recv()).await;
    print(
        "queue deleted under its consumer",
        serde_json::json!({ "stream_ended": matches!(ended, Ok(None)),
            "after_ms": t.elapsed().as_millis(), "callbacks": events.0.lock().unwrap().clone() }),
    );

    closed_by_broker(&prefix).await?;
    silent_peer(&prefix).await?;
    let _ = conn.close().await;
    Ok(())
}

/// The broker closes the connection (as `rabbitmqctl close_connection` or a node's shutdown
/// does): does a consumer's stream end, and does a publish fail rather than hang?
async fn closed_by_broker(prefix: &str) -> anyhow::Result<()> {
    let name = format!("{prefix}.closed");
    let conn = Connection::open(&args(5672, &name)).await?;
    let ch = conn.open_channel(None).await?;
    ch.register_callback(Events::default()).await?;
    let (q, _, _) =
        ch.queue_declare(QueueDeclareArguments::exclusive_server_named()).await?.unwrap();
    let (_, mut rx) = ch.basic_consume_rx(BasicConsumeArguments::new(&q, "").finish()).await?;
    let pid = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "rabbitmqctl list_connections pid client_properties | grep '{name}' | cut -f1"
        ))
        .output()?;
    let pid = String::from_utf8_lossy(&pid.stdout).trim().to_owned();
    let t = Instant::now();
    std::process::Command::new("rabbitmqctl").args(["close_connection", &pid, "probe"]).output()?;
    let ended = tokio::time::timeout(Duration::from_secs(15), rx.recv()).await;
    let stream_ms = t.elapsed().as_millis();
    let publish = tokio::time::timeout(
        Duration::from_secs(5),
        ch.basic_publish(
            BasicProperties::default(),
            b"x".to_vec(),
            BasicPublishArguments::new("", &q),
        ),
    )
    .await;
    print(
        "connection closed by the broker",
        serde_json::json!({ "connection_pid_found": !pid.is_empty(),
            "stream_ended": matches!(ended, Ok(None)), "after_ms": stream_ms,
            "connection_open_after": conn.is_open(),
            "publish_after": match publish { Err(_) => "hung 5 s".to_owned(),
                Ok(Ok(())) => "ok".to_owned(), Ok(Err(e)) => format!("error: {e}") } }),
    );
    Ok(())
}

/// The broker goes silent without closing anything (a frozen host, a partition): a proxy that
/// stops forwarding. Does the 5 s heartbeat end the consumer's stream, and when?
async fn silent_peer(prefix: &str) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let frozen = Arc::new(tokio::sync::Notify::new());
    let freeze = frozen.clone();
    tokio::spawn(async move {
        let Ok((client, _)) = listener.accept().await else { return };
        let Ok(broker) = TcpStream::connect("127.0.0.1:5672").await else { return };
        let (mut cr, mut cw) = client.into_split();
        let (mut br, mut bw) = broker.into_split();
        tokio::select! {
            _ = tokio::io::copy(&mut cr, &mut bw) => {}
            _ = tokio::io::copy(&mut br, &mut cw) => {}
            _ = freeze.notified() => {}
        }
        // Keep both sockets open and unread: silence, no reset.
        let _keep = (cr, cw.flush().await, br, bw);
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    let conn = Connection::open(&args(port, &format!("{prefix}.silent"))).await?;
    let ch = conn.open_channel(None).await?;
    ch.register_callback(Events::default()).await?;
    let (q, _, _) =
        ch.queue_declare(QueueDeclareArguments::exclusive_server_named()).await?.unwrap();
    let (_, mut rx) = ch.basic_consume_rx(BasicConsumeArguments::new(&q, "").finish()).await?;
    frozen.notify_one();
    let t = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(40), rx.recv()).await;
    print(
        "silent broker (heartbeat 5 s)",
        serde_json::json!({ "stream_ended": matches!(ended, Ok(None)),
            "after_ms": t.elapsed().as_millis(), "connection_open_after": conn.is_open() }),
    );
    Ok(())
}

/// Consumes one message of `queue` (left unacked) with amqprs and says what it made of it.
pub async fn get_one(queue: &str) -> anyhow::Result<()> {
    let conn = Connection::open(&args(5672, "probe-get")).await?;
    let ch = conn.open_channel(None).await?;
    ch.register_callback(Events::default()).await?;
    let (_, mut rx) = ch.basic_consume_rx(BasicConsumeArguments::new(queue, "").finish()).await?;
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Some(m)) => {
            println!(
                "delivered: reply_to {:?}",
                m.basic_properties.and_then(|p| p.reply_to().cloned())
            )
        }
        Ok(None) => println!("consumer ended"),
        Err(_) => println!("nothing in 5 s"),
    }
    println!("connection open after: {}", conn.is_open());
    Ok(())
}
