//! Loopback servers for clients' tests (cloud metadata, object stores): an axum router on
//! a free port, a port that refuses connections, one that never answers, one whose answer
//! never ends.

use axum::Router;

/// Serves `router` on a loopback port: its base URL.
pub async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// A loopback URL where nothing listens (connections are refused).
pub async fn closed_port() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// A loopback URL that accepts connections and never answers.
pub async fn silent_port() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    format!("http://{addr}")
}

/// A loopback URL whose every request is answered 200 with a body that never ends (no
/// length, chunks of Prometheus comments until the client goes away).
pub async fn endless_body() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = sock.read(&mut request).await;
                let head =
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n";
                if sock.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = "# more to come\n".repeat(4096);
                while sock.write_all(chunk.as_bytes()).await.is_ok() {}
            });
        }
    });
    format!("http://{addr}")
}
