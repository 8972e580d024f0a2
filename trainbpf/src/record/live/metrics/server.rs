//! The `/metrics` endpoint: hyper on its own thread and its own runtime,
//! so that a scrape never waits on the rings, nor the rings on a scrape.
//! Bounded against clients that misbehave: a few connections at once, one
//! request each, a deadline on reading the request and on the whole
//! exchange; a full server closes its longest idle connection to let a new
//! one in (`conns.rs`). It answers `GET /metrics` and nothing else.

use std::{
    convert::Infallible,
    io,
    net::{SocketAddr, TcpListener, ToSocketAddrs},
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};

use super::{Metrics, conns::Conns};

/// Connections served at once; past it, the longest idle one is closed
/// for the new one, which is refused only when every one is busy.
const MAX_CONNECTIONS: usize = 16;
/// Time for a client to send its request's head from its connect: a
/// scraper sends it at once, so a connection silent for this long is one
/// that holds a slot and asks nothing.
const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// Time for a whole connection: Prometheus' own default scrape timeout,
/// past which the scrape has failed on its side anyway. It bounds how long
/// a client that asks and then never reads the answer holds a slot.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `--metrics ADDR`: `HOST:PORT`, `[V6]:PORT`, or `:PORT` for every
/// IPv4 interface, as exporters spell it.
pub fn bind(addr: &str) -> io::Result<TcpListener> {
    let addrs = addresses(addr)?;
    let l = TcpListener::bind(&addrs[..])?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The addresses `ADDR` names. An IPv6 address without brackets
/// (`fd00::5:9478`) is taken too: a manifest writes `$(POD_IP):9478`
/// whatever the family of the pod's IP.
fn addresses(addr: &str) -> io::Result<Vec<SocketAddr>> {
    let bare_v6 = addr.rsplit_once(':').and_then(|(ip, port)| {
        let ip: std::net::Ipv6Addr = ip.parse().ok()?;
        Some(SocketAddr::new(ip.into(), port.parse().ok()?))
    });
    if let Some(a) = bare_v6 {
        return Ok(vec![a]);
    }
    let spelled = match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_string(),
    };
    let addrs: Vec<SocketAddr> = spelled.to_socket_addrs()?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr}: no address"),
        ));
    }
    Ok(addrs)
}

/// Serves `metrics` on `listener` from a thread of its own, for the
/// recorder's lifetime.
pub fn serve(listener: TcpListener, metrics: Arc<Metrics>) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("trainbpf-metrics".into())
        .spawn(move || rt.block_on(accept_loop(listener, metrics)))?;
    Ok(())
}

async fn accept_loop(listener: TcpListener, metrics: Arc<Metrics>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("trainbpf: warning: --metrics: {e}; not serving");
            return;
        }
    };
    let conns = Arc::new(Conns::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: try again shortly.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(admitted) = conns.admit(Instant::now()) else {
            drop(stream);
            continue;
        };
        let (conns, metrics) = (conns.clone(), metrics.clone());
        tokio::spawn(async move {
            let id = admitted.id;
            let asked = conns.clone();
            let svc = hyper::service::service_fn(move |req| {
                // The head is read: from now on a scrape under way.
                asked.busy(id);
                let r = respond(&metrics, &req);
                async move { Ok::<_, Infallible>(r) }
            });
            // One request per connection: a connection is then idle only
            // before its request, never between two, and closing an idle
            // one never cuts an answer short.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            // Dropping the connection's future closes its socket.
            tokio::select! {
                _ = conn => {}
                () = admitted.close.notified() => {}
                () = tokio::time::sleep(CONNECTION_TIMEOUT) => {}
            }
            conns.closed(id);
        });
    }
}

fn respond(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status, ctype: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = header::HeaderValue::from_str(ctype) {
            r.headers_mut().insert(header::CONTENT_TYPE, v);
        }
        r
    };
    match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => reply(
            StatusCode::OK,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            metrics.encode(),
        ),
        (&Method::GET | &Method::HEAD, _) => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "trainbpf record serves /metrics\n".into(),
        ),
        _ => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            String::new(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_spelled_as_exporters_and_manifests_do() {
        let one = |a: &str| addresses(a).unwrap();
        assert_eq!(one("127.0.0.2:9478"), ["127.0.0.2:9478".parse().unwrap()]);
        assert_eq!(one(":9478"), ["0.0.0.0:9478".parse().unwrap()]);
        assert_eq!(one("[fd00::5]:9478"), ["[fd00::5]:9478".parse().unwrap()]);
        // `$(POD_IP):9478` with an IPv6 pod IP.
        assert_eq!(one("fd00::5:9478"), ["[fd00::5]:9478".parse().unwrap()]);
        assert_eq!(one("::1:9478"), ["[::1]:9478".parse().unwrap()]);
        for bad in ["fd00::9478", "127.0.0.1", "127.0.0.1:99999", ":"] {
            assert!(addresses(bad).is_err(), "{bad}");
        }
    }
}
