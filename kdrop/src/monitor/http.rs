//! A minimal HTTP/1.1 server for `GET /metrics`: one request per
//! connection, bounded in size and time, the body rendered by the monitor
//! loop (which owns the maps) on request.
use std::{sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot, Semaphore},
};

/// A scrape waiting for its body.
pub use crate::session::Scrape;

const MAX_REQUEST: usize = 8192;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 16;

pub async fn serve(listener: TcpListener, scrapes: mpsc::Sender<Scrape>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let scrapes = scrapes.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, handle(stream, scrapes)).await;
            drop(slot);
        });
    }
}

/// What to answer to a request head.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    Metrics,
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

pub fn route(head: &str) -> Route {
    let mut parts = head.lines().next().unwrap_or("").split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => Route::Metrics,
        (_, "/metrics") => Route::MethodNotAllowed,
        _ => Route::NotFound,
    }
}

async fn handle(mut stream: TcpStream, scrapes: mpsc::Sender<Scrape>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || buf.len() + n > MAX_REQUEST {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let head_only = head.starts_with("HEAD ");
    let (status, body) = match route(&head) {
        Route::Metrics => {
            let (tx, rx) = oneshot::channel();
            if scrapes.send(tx).await.is_err() {
                return Ok(());
            }
            match rx.await {
                Ok(body) => ("200 OK", body),
                Err(_) => return Ok(()),
            }
        }
        Route::NotFound => ("404 Not Found", "kdrop serves /metrics\n".to_string()),
        Route::MethodNotAllowed => ("405 Method Not Allowed", "GET /metrics\n".to_string()),
        Route::BadRequest => ("400 Bad Request", String::new()),
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        resp.push_str(&body);
    }
    stream.write_all(resp.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics
        );
        assert_eq!(route("GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(route("HEAD /metrics HTTP/1.1\r\n\r\n"), Route::Metrics);
        assert_eq!(
            route("POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(route("GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route("GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(route("garbage"), Route::BadRequest);
    }
}
