//! `--metrics ADDR`: serves `/metrics` (and nothing else) on its own thread. Each scrape asks `source` for
//! the view of the moment and renders it in the format the scraper's `Accept` header asks for; the samplers
//! are never waited on (the source reads what they published).

use crate::metrics::{self, Format, View};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Where to listen: `PORT` alone is loopback (127.0.0.1:PORT); `HOST:PORT` as given (0.0.0.0 to serve
/// every interface).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let full = if s.chars().all(|c| c.is_ascii_digit()) {
        format!("127.0.0.1:{s}")
    } else {
        s.to_string()
    };
    full.to_socket_addrs()
        .map_err(|e| format!("`{s}`: {e} (give PORT, or HOST:PORT)"))?
        .next()
        .ok_or_else(|| format!("`{s}`: no address"))
}

/// What builds the view at each scrape.
pub type Source = Arc<dyn Fn() -> View + Send + Sync>;

/// A running `/metrics` server.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds now (so a taken port fails before the command starts) and serves on a thread of its own.
    pub fn start(addr: SocketAddr, source: Source) -> Result<Server, String> {
        let http = tiny_http::Server::http(addr).map_err(|e| format!("{addr}: {e}"))?;
        let addr = http
            .server_addr()
            .to_ip()
            .ok_or_else(|| format!("{addr}: not an IP address"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gpudoc-metrics".into())
            .spawn(move || {
                while !flag.load(Ordering::SeqCst) {
                    match http.recv_timeout(Duration::from_millis(100)) {
                        Ok(Some(req)) => answer(req, &source),
                        Ok(None) => {}
                        Err(_) => break,
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Server {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address bound (the port the system chose for `:0`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving; a scrape in progress finishes first.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(req: tiny_http::Request, source: &Source) {
    use tiny_http::{Header, Method, Response};
    let text = |code: u16, body: &str| {
        Response::from_string(body)
            .with_status_code(code)
            .with_header(
                Header::from_bytes("Content-Type", "text/plain; charset=utf-8")
                    .expect("a valid header"),
            )
    };
    let path = req.url().split('?').next().unwrap_or("");
    if !matches!(req.method(), Method::Get | Method::Head) {
        let _ = req.respond(text(405, "only GET\n"));
        return;
    }
    if path != "/metrics" {
        let _ = req.respond(text(404, "gpudoc serves /metrics only\n"));
        return;
    }
    let accept = req
        .headers()
        .iter()
        .find(|h| h.field.equiv("Accept"))
        .map(|h| h.value.as_str().to_string())
        .unwrap_or_default();
    let format = Format::negotiate(&accept);
    let body = metrics::render(&source(), format);
    let ct = Header::from_bytes("Content-Type", format.content_type()).expect("a valid header");
    let _ = req.respond(Response::from_string(body).with_header(ct));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str, accept: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_in_the_format_asked_and_nothing_else() {
        let source: Source = Arc::new(|| View {
            host: "h".into(),
            ..Default::default()
        });
        let server = Server::start(parse_addr("0").unwrap(), source).unwrap();
        let addr = server.addr();
        assert!(addr.ip().is_loopback());
        let plain = get(addr, "/metrics", "text/plain");
        assert!(plain.starts_with("HTTP/1.1 200"), "{plain}");
        assert!(plain.contains("text/plain; version=0.0.4"), "{plain}");
        assert!(plain.contains("gpudoc_gpus_lost{host=\"h\"} 0"), "{plain}");
        let om = get(
            addr,
            "/metrics",
            "application/openmetrics-text; version=1.0.0",
        );
        assert!(
            om.contains("application/openmetrics-text") && om.ends_with("# EOF\n"),
            "{om}"
        );
        assert!(get(addr, "/", "*/*").starts_with("HTTP/1.1 404"));
        server.stop();
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addr("9400").unwrap().to_string(), "127.0.0.1:9400");
        assert_eq!(
            parse_addr("0.0.0.0:9400").unwrap().to_string(),
            "0.0.0.0:9400"
        );
        assert!(parse_addr("nope").is_err());
    }
}
