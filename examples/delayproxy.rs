//! A TCP relay that makes a server look farther away: every piece of bytes a client sends is
//! held for a fixed delay before it is passed on (the server's answers pass at once), so each
//! round trip through it takes that much longer, as with a database in another zone. For
//! benchmarks and tests of the PostgreSQL engine (scripts/bench-pg.sh); not a protocol
//! parser: bytes are relayed as they come, in order.
//!
//! Usage: cargo run --release --example delayproxy -- LISTEN UPSTREAM DELAY_MS
//!   e.g. delayproxy 127.0.0.1:6000 127.0.0.1:5432 1     (prints "listening on ADDR")
//!
//! Each connection gets two threads; the delayed direction stamps each read with the time
//! it arrived and a second thread writes it at that time plus the delay (so a burst of
//! messages is delayed once, not once per message). std's sleep is used rather than a timer
//! wheel: it wakes within tens of microseconds, where tokio's 1 ms granularity would add up
//! to a millisecond to a 1 ms delay.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, upstream, delay] = args.as_slice() else {
        eprintln!(
            "usage: delayproxy LISTEN UPSTREAM DELAY_MS (e.g. 127.0.0.1:6000 127.0.0.1:5432 1)"
        );
        std::process::exit(2);
    };
    let delay: f64 = delay.parse().unwrap_or_else(|_| {
        eprintln!("invalid DELAY_MS '{delay}': give milliseconds, e.g. 1 or 0.5");
        std::process::exit(2);
    });
    let delay = Duration::from_secs_f64(delay / 1000.0);
    let listener = TcpListener::bind(listen).unwrap_or_else(|e| {
        eprintln!("cannot listen on {listen}: {e}");
        std::process::exit(1);
    });
    println!("listening on {}", listener.local_addr().expect("bound"));
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let upstream = upstream.clone();
        std::thread::spawn(move || {
            if let Err(e) = relay(client, &upstream, delay) {
                eprintln!("delayproxy: {e}");
            }
        });
    }
}

fn relay(client: TcpStream, upstream: &str, delay: Duration) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    // Server to client: at once.
    let (mut from_server, mut to_client) = (server.try_clone()?, client.try_clone()?);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Write);
    });
    // Client to server: each read stamped on arrival, written at its time.
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut to_server = server;
    let writer = std::thread::spawn(move || {
        for (due, bytes) in rx {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if to_server.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(Shutdown::Write);
    });
    let mut from_client = client;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from_client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if tx
            .send((Instant::now() + delay, buf[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
    Ok(())
}
