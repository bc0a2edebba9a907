//! A raw QUIC transfer to or from a `strata peer sink` process: the
//! transport baseline the peer benchmarks compare against.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One raw stream: upload (op 0) or download (op 1) of `n` bytes.
pub async fn raw(
    ep: &quinn::Endpoint,
    addr: SocketAddr,
    op: u8,
    n: u64,
) -> Result<Duration, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let conn = ep
        .connect(addr, "sink")
        .map_err(|x| e(&x))?
        .await
        .map_err(|x| e(&x))?;
    let t = Instant::now();
    let (mut send, mut recv) = conn.open_bi().await.map_err(|x| e(&x))?;
    let mut head = vec![op];
    head.extend_from_slice(&n.to_le_bytes());
    send.write_all(&head).await.map_err(|x| e(&x))?;
    if op == 0 {
        let buf = vec![7u8; 1 << 20];
        let mut left = n;
        while left > 0 {
            let k = left.min(buf.len() as u64) as usize;
            send.write_all(&buf[..k]).await.map_err(|x| e(&x))?;
            left -= k as u64;
        }
        send.finish().map_err(|x| e(&x))?;
        let mut got = [0u8; 8];
        recv.read_exact(&mut got).await.map_err(|x| e(&x))?;
        if u64::from_le_bytes(got) != n {
            return Err("the sink got fewer bytes".into());
        }
    } else {
        send.finish().map_err(|x| e(&x))?;
        let mut got = 0u64;
        while let Some(c) = recv.read_chunk(usize::MAX, true).await.map_err(|x| e(&x))? {
            got += c.bytes.len() as u64;
        }
        if got != n {
            return Err(format!("downloaded {got} of {n} bytes"));
        }
    }
    let d = t.elapsed();
    conn.close(0u32.into(), b"done");
    Ok(d)
}
