//! A fast order-0 Huffman coder for byte planes.
//!
//! The exponent plane of float weights has an entropy near 2.7 bits per byte
//! and little repetition an LZ coder can use: zstd spends its time finding
//! short matches there, while a plain entropy coder reaches the order-0 bound
//! at several times the speed. This coder is built for that case:
//!
//! * code lengths limited to [`MAX_LEN`] bits, canonical codes, written
//!   LSB-first;
//! * the plane is cut into [`STREAMS`] interleaved bitstreams so the decoder's
//!   dependency chains overlap;
//! * decoding uses a table indexed by the next [`MAX_LEN`] bits that yields up
//!   to four symbols per lookup.
//!
//! Encoded layout (little-endian):
//!
//! ```text
//! 128 bytes      code lengths of symbols 0..=255, two per byte (low nibble first), 0 = unused
//! 3 × u32        byte lengths of streams 0, 1, 2 (stream 3 takes the rest)
//! streams        each a bitstream of the codes of its quarter of the plane
//! ```
//!
//! Stream k holds symbols `[k*q, (k+1)*q)` with `q = n / 4`, the last stream
//! also the remainder. Every length in the input is checked; an invalid code
//! (an over-full length set, a bit pattern no code starts with, a stream that
//! ends early) is an error, never a panic.

use crate::error::{FormatError, Result};

/// Longest code, in bits; also the decoder's table index width.
pub(crate) const MAX_LEN: u32 = 11;
/// Number of interleaved streams.
pub(crate) const STREAMS: usize = 4;
const TABLE: usize = 1 << MAX_LEN;
const HEADER: usize = 128 + 4 * (STREAMS - 1);

/// Huffman code lengths for a histogram, limited to [`MAX_LEN`] bits.
fn code_lengths(hist: &[u64; 256]) -> [u8; 256] {
    let mut counts = *hist;
    loop {
        let lens = unlimited_lengths(&counts);
        if lens.iter().all(|&l| u32::from(l) <= MAX_LEN) {
            return lens;
        }
        // Flatten the distribution and retry; converges to lengths <= 8.
        for c in counts.iter_mut().filter(|c| **c > 0) {
            *c = (*c >> 1) | 1;
        }
    }
}

/// Plain Huffman lengths (two-queue construction over sorted leaves).
fn unlimited_lengths(counts: &[u64; 256]) -> [u8; 256] {
    let mut lens = [0u8; 256];
    let mut leaves: Vec<(u64, usize)> = counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(s, &c)| (c, s))
        .collect();
    match leaves.len() {
        0 => return lens,
        1 => {
            lens[leaves[0].1] = 1;
            return lens;
        }
        _ => {}
    }
    leaves.sort_unstable();
    // Nodes: leaves first, then internal nodes; parent links to derive depths.
    let n = leaves.len();
    let mut weight: Vec<u64> = leaves.iter().map(|l| l.0).collect();
    let mut parent = vec![usize::MAX; 2 * n - 1];
    weight.resize(2 * n - 1, 0);
    let (mut leaf, mut internal, mut next) = (0usize, n, n);
    let pick = |weight: &Vec<u64>, leaf: &mut usize, internal: &mut usize, next: usize| -> usize {
        if *leaf < n && (*internal >= next || weight[*leaf] <= weight[*internal]) {
            *leaf += 1;
            *leaf - 1
        } else {
            *internal += 1;
            *internal - 1
        }
    };
    while next < 2 * n - 1 {
        let a = pick(&weight, &mut leaf, &mut internal, next);
        let b = pick(&weight, &mut leaf, &mut internal, next);
        weight[next] = weight[a] + weight[b];
        parent[a] = next;
        parent[b] = next;
        next += 1;
    }
    let mut depth = vec![0u8; 2 * n - 1];
    for i in (0..2 * n - 2).rev() {
        depth[i] = depth[parent[i]].saturating_add(1);
    }
    for (i, &(_, s)) in leaves.iter().enumerate() {
        lens[s] = depth[i];
    }
    lens
}

/// Canonical codes (bit-reversed for LSB-first output) from lengths.
fn canonical_codes(lens: &[u8; 256]) -> [u32; 256] {
    let mut codes = [0u32; 256];
    let mut order: Vec<usize> = (0..256).filter(|&s| lens[s] > 0).collect();
    order.sort_unstable_by_key(|&s| (lens[s], s));
    let mut code = 0u32;
    let mut prev = 0u8;
    for s in order {
        code <<= lens[s] - prev;
        prev = lens[s];
        codes[s] = code.reverse_bits() >> (32 - u32::from(lens[s]));
        code += 1;
    }
    codes
}

/// Histogram of a plane, with four sub-histograms to avoid store stalls.
pub(crate) fn histogram(data: &[u8]) -> [u64; 256] {
    let mut h = [[0u32; 256]; 4];
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        h[0][usize::from(c[0])] += 1;
        h[1][usize::from(c[1])] += 1;
        h[2][usize::from(c[2])] += 1;
        h[3][usize::from(c[3])] += 1;
    }
    for &b in chunks.remainder() {
        h[0][usize::from(b)] += 1;
    }
    let mut out = [0u64; 256];
    for (s, o) in out.iter_mut().enumerate() {
        *o = h.iter().map(|x| u64::from(x[s])).sum();
    }
    out
}

/// Encodes `data` into `scratch` and returns the encoded length: the
/// encoding is `scratch[..len]`. `scratch` only ever grows, so a reused one
/// costs no zeroing or page faults. The caller keeps the result only if it
/// is smaller than `data`.
pub(crate) fn encode(data: &[u8], scratch: &mut Vec<u8>) -> usize {
    let lens = code_lengths(&histogram(data));
    encode_with(data, &lens, scratch)
}

/// Encodes with code lengths that give every symbol of `data` a code.
fn encode_with(data: &[u8], lens: &[u8; 256], scratch: &mut Vec<u8>) -> usize {
    let codes = canonical_codes(lens);
    // Code and length packed together: one table load per symbol.
    let mut table = [0u64; 256];
    for s in 0..256 {
        table[s] = u64::from(codes[s]) | (u64::from(lens[s]) << 32);
    }
    let q = data.len() / STREAMS;
    let parts: [&[u8]; STREAMS] = std::array::from_fn(|k| {
        if k + 1 == STREAMS {
            &data[k * q..]
        } else {
            &data[k * q..(k + 1) * q]
        }
    });
    // Each stream gets a region big enough for MAX_LEN bits per symbol plus
    // slack for the 8-byte stores.
    let region = |len: usize| len * MAX_LEN as usize / 8 + 16;
    let mut starts = [0usize; STREAMS];
    let mut need = HEADER;
    for k in 0..STREAMS {
        starts[k] = need;
        need += region(parts[k].len());
    }
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    for (i, pair) in lens.chunks_exact(2).enumerate() {
        scratch[i] = pair[0] | (pair[1] << 4);
    }

    // The four streams are encoded in one interleaved loop: four independent
    // dependency chains keep the core busy. Between flushes each stream gains
    // at most 4 × 11 bits on top of at most 7 left over: under 64.
    let mut acc = [0u64; STREAMS];
    let mut bits = [0u32; STREAMS];
    let mut pos = starts;
    let mut i = 0;
    while i + 4 <= q {
        // Symbol-major order: adjacent operations belong to different streams.
        for j in 0..4 {
            for k in 0..STREAMS {
                let e = table[usize::from(parts[k][i + j])];
                acc[k] |= (e & 0xFFFF_FFFF) << bits[k];
                bits[k] += (e >> 32) as u32;
            }
        }
        for k in 0..STREAMS {
            scratch[pos[k]..pos[k] + 8].copy_from_slice(&acc[k].to_le_bytes());
            let whole = bits[k] >> 3;
            pos[k] += whole as usize;
            acc[k] = acc[k].checked_shr(whole * 8).unwrap_or(0);
            bits[k] &= 7;
        }
        i += 4;
    }
    // Tails, one symbol at a time (stream 3 also has the remainder).
    for k in 0..STREAMS {
        for &sym in &parts[k][i..] {
            let e = table[usize::from(sym)];
            acc[k] |= (e & 0xFFFF_FFFF) << bits[k];
            bits[k] += (e >> 32) as u32;
            if bits[k] >= 32 {
                scratch[pos[k]..pos[k] + 4].copy_from_slice(&(acc[k] as u32).to_le_bytes());
                pos[k] += 4;
                acc[k] >>= 32;
                bits[k] -= 32;
            }
        }
        let tail = bits[k].div_ceil(8) as usize;
        scratch[pos[k]..pos[k] + 8].copy_from_slice(&acc[k].to_le_bytes());
        pos[k] += tail;
    }
    // Close the gaps between the regions and record the stream lengths.
    let mut end = starts[0];
    for k in 0..STREAMS {
        let len = pos[k] - starts[k];
        scratch.copy_within(starts[k]..pos[k], end);
        end += len;
        if k + 1 < STREAMS {
            // At most 11 bits per symbol of a plane <= 256 MiB: fits in u32.
            let o = 128 + 4 * k;
            scratch[o..o + 4].copy_from_slice(&(len as u32).to_le_bytes());
        }
    }
    end
}

/// The multi-symbol decoding table: for every `MAX_LEN`-bit window, up to
/// four symbols (low 32 bits), their count (bits 32..40, 0 = invalid) and the
/// bits they use (bits 40..48).
struct DecodeTable {
    multi: Vec<u64>,
    /// Single-symbol entries: symbol (low 8 bits) and length (bits 8..16, 0 = invalid).
    single: Vec<u16>,
}

fn decode_table(lens: &[u8; 256]) -> Result<DecodeTable> {
    let what = "huffman plane";
    let kraft: u64 = lens
        .iter()
        .filter(|&&l| l > 0)
        .map(|&l| 1u64 << (MAX_LEN - u32::from(l)))
        .sum();
    if kraft == 0 || kraft > TABLE as u64 {
        return Err(FormatError::malformed(what, "invalid code lengths"));
    }
    let codes = canonical_codes(lens);
    let mut single = vec![0u16; TABLE];
    for s in 0..256usize {
        let l = u32::from(lens[s]);
        if l == 0 {
            continue;
        }
        // Every window whose low l bits are the code decodes to s.
        let mut w = codes[s] as usize;
        while w < TABLE {
            single[w] = s as u16 | ((l as u16) << 8);
            w += 1 << l;
        }
    }
    let mut multi = vec![0u64; TABLE];
    for (w, m) in multi.iter_mut().enumerate() {
        let mut syms = 0u64;
        let mut count = 0u64;
        let mut used = 0u32;
        while count < 4 {
            let e = single[w >> used];
            let l = u32::from(e >> 8);
            if l == 0 || used + l > MAX_LEN {
                break;
            }
            syms |= u64::from(e & 0xFF) << (8 * count);
            count += 1;
            used += l;
        }
        *m = syms | (count << 32) | (u64::from(used) << 40);
    }
    Ok(DecodeTable { multi, single })
}

/// One stream's read position.
struct Stream<'a> {
    data: &'a [u8],
    bit: usize,
}

impl Stream<'_> {
    /// The next 64 bits at the read position (zeros past the end).
    #[inline(always)]
    fn peek(&self) -> u64 {
        let byte = self.bit >> 3;
        let word = match self.data.get(byte..byte + 8) {
            Some(b) => {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                u64::from_le_bytes(a)
            }
            None => {
                let mut a = [0u8; 8];
                let rest = self.data.get(byte..).unwrap_or(&[]);
                a[..rest.len()].copy_from_slice(rest);
                u64::from_le_bytes(a)
            }
        };
        word >> (self.bit & 7)
    }

    fn overran(&self) -> bool {
        self.bit > self.data.len() * 8
    }
}

/// Decodes a Huffman-coded plane of exactly `out.len()` symbols.
pub(crate) fn decode(input: &[u8], out: &mut [u8]) -> Result<()> {
    let what = "huffman plane";
    if input.len() < HEADER {
        return Err(FormatError::Truncated {
            what,
            needed: HEADER as u64,
            available: input.len() as u64,
        });
    }
    if out.is_empty() {
        return Ok(());
    }
    let mut lens = [0u8; 256];
    for (i, &b) in input[..128].iter().enumerate() {
        lens[2 * i] = b & 0x0F;
        lens[2 * i + 1] = b >> 4;
    }
    if lens.iter().any(|&l| u32::from(l) > MAX_LEN) {
        return Err(FormatError::malformed(what, "code longer than the limit"));
    }
    let t = decode_table(&lens)?;
    let mut at = HEADER;
    let mut streams: Vec<Stream<'_>> = Vec::with_capacity(STREAMS);
    for k in 0..STREAMS {
        let len = if k + 1 < STREAMS {
            let o = 128 + 4 * k;
            u32::from_le_bytes([input[o], input[o + 1], input[o + 2], input[o + 3]]) as usize
        } else {
            input.len() - at
        };
        let data = input
            .get(at..at.saturating_add(len))
            .ok_or_else(|| FormatError::malformed(what, "stream lengths exceed the plane"))?;
        streams.push(Stream { data, bit: 0 });
        at += len;
    }

    let n = out.len();
    let q = n / STREAMS;
    let bounds: [(usize, usize); STREAMS] =
        std::array::from_fn(|k| (k * q, if k + 1 == STREAMS { n } else { (k + 1) * q }));
    let mut pos: [usize; STREAMS] = std::array::from_fn(|k| bounds[k].0);
    let mut bad = false;
    let mask = (TABLE - 1) as u64;

    // Fast path: the four streams in lock-step, two table lookups per 64-bit
    // read (each uses at most 11 of the 57 fresh bits), while every stream
    // has room for two 4-byte stores.
    while (0..STREAMS).all(|k| pos[k] + 8 <= bounds[k].1) {
        for k in 0..STREAMS {
            let s = &mut streams[k];
            let w = s.peek();
            let e1 = t.multi[(w & mask) as usize];
            let used1 = (e1 >> 40) & 0xFF;
            let e2 = t.multi[((w >> used1) & mask) as usize];
            let (c1, c2) = (((e1 >> 32) & 0xFF) as usize, ((e2 >> 32) & 0xFF) as usize);
            bad |= c1 == 0 || c2 == 0;
            let p = pos[k];
            out[p..p + 4].copy_from_slice(&(e1 as u32).to_le_bytes());
            out[p + c1..p + c1 + 4].copy_from_slice(&(e2 as u32).to_le_bytes());
            pos[k] = p + c1 + c2;
            s.bit += (used1 + ((e2 >> 40) & 0xFF)) as usize;
        }
        if bad {
            return Err(FormatError::malformed(
                what,
                "bit pattern that no code starts with",
            ));
        }
    }
    // Tails: one symbol at a time.
    for k in 0..STREAMS {
        let s = &mut streams[k];
        while pos[k] < bounds[k].1 {
            let e = t.single[(s.peek() as usize) & (TABLE - 1)];
            let l = usize::from(e >> 8);
            if l == 0 {
                return Err(FormatError::malformed(
                    what,
                    "bit pattern that no code starts with",
                ));
            }
            out[pos[k]] = e as u8;
            pos[k] += 1;
            s.bit += l;
        }
        if s.overran() {
            return Err(FormatError::malformed(
                what,
                format!("stream {k} ends before its symbols"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(data: &[u8]) -> usize {
        let mut enc = Vec::new();
        let len = encode(data, &mut enc);
        enc.truncate(len);
        let mut back = vec![0u8; data.len()];
        decode(&enc, &mut back).unwrap();
        assert_eq!(back, data);
        enc.len()
    }

    #[test]
    fn round_trips_edge_cases() {
        round_trip(&[]);
        round_trip(&[5]);
        round_trip(&[5; 1000]);
        round_trip(&[1, 2, 3, 4, 5, 6, 7]);
        round_trip(&(0..=255u8).cycle().take(100_000).collect::<Vec<_>>());
    }

    #[test]
    fn skewed_data_reaches_near_entropy_and_lengths_stay_limited() {
        // Geometric-ish distribution over 40 symbols, with a long tail that
        // would give codes longer than MAX_LEN without the limit.
        let mut x = 7u64;
        let data: Vec<u8> = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x.trailing_zeros().min(40) + 100) as u8
            })
            .collect();
        let enc = round_trip(&data);
        let h = crate::codec::planes::entropy_of(
            &{
                let mut h = [0u32; 256];
                for &b in &data {
                    h[usize::from(b)] += 1;
                }
                h
            },
            data.len() as u64,
        );
        let bound = data.len() as f64 * h / 8.0;
        assert!(
            (enc as f64) < bound * 1.03 + 200.0,
            "{enc} vs entropy bound {bound}"
        );
        let lens = code_lengths(&histogram(&data));
        assert!(lens.iter().all(|&l| u32::from(l) <= MAX_LEN));
    }

    #[test]
    fn damaged_input_is_an_error_not_a_panic() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 13) as u8).collect();
        let mut enc = Vec::new();
        let len = encode(&data, &mut enc);
        enc.truncate(len);
        let mut out = vec![0u8; data.len()];
        assert!(decode(&enc[..HEADER - 1], &mut out).is_err());
        assert!(
            decode(&enc[..enc.len() / 2], &mut out).is_err(),
            "streams end early"
        );
        let mut over = enc.clone();
        over[..128].fill(0x11); // every symbol length 1: over-full code
        assert!(decode(&over, &mut out).is_err());
        let mut lens = enc.clone();
        lens[128..140].fill(0xFF); // stream lengths beyond the input
        assert!(decode(&lens, &mut out).is_err());
    }
}
