//! Where each byte of a synthesized file comes from: the header bytes
//! made here, and ranges of entries of some rank's shard.
//!
//! - [`ShardFile`]: `rank-N.safetensors`, one shard as `strata export`
//!   writes it (the header from [`crate::safetensors_io::shard_file`]).
//! - [`ModelFile`]: `model.safetensors`, every tensor whose pieces carry
//!   a place in a global tensor (`strata.layout`: DCP write items,
//!   DTensor shards), assembled by FQN in its global shape from every
//!   rank's pieces.
//!
//! A read is planned into [`Part`]s; the caller fills each from the
//! shard's reader (verified chunks, tier fallback).

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_format::safetensors::encode_header;
use strata_format::{DType, EntryKind, ShardManifest};

use crate::show::places;
use crate::CliError;

/// One piece of a read of `len` bytes into `dst` (an offset in the
/// caller's buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// Bytes of the file's own header, from `from` in it.
    Header { dst: usize, from: usize, len: usize },
    /// Bytes of entry `entry` of rank `rank`'s shard, from byte `at`.
    Entry {
        rank: u32,
        entry: String,
        at: u64,
        dst: usize,
        len: usize,
    },
}

/// The bytes `[off, off + len)` of a file made of `prefix` then `pieces`
/// (each `(begin, end, rank, entry)` in file order, back to back).
fn plan_pieces(
    prefix_len: u64,
    rank: u32,
    pieces: &[(u64, u64, String)],
    off: u64,
    len: u64,
) -> Vec<Part> {
    let end = off.saturating_add(len);
    let mut out = Vec::new();
    if off < prefix_len {
        let n = end.min(prefix_len) - off;
        out.push(Part::Header {
            dst: 0,
            from: off as usize,
            len: n as usize,
        });
    }
    // The first piece ending after `off` (pieces are sorted by begin).
    let first = pieces.partition_point(|p| p.1 <= off);
    for (b, e, entry) in &pieces[first..] {
        let (b, e) = (*b, *e);
        if b >= end {
            break;
        }
        let (lo, hi) = (b.max(off), e.min(end));
        if lo < hi {
            out.push(Part::Entry {
                rank,
                entry: entry.to_string(),
                at: lo - b,
                dst: (lo - off) as usize,
                len: (hi - lo) as usize,
            });
        }
    }
    out
}

/// `rank-N.safetensors`: a shard as a safetensors file.
pub(crate) struct ShardFile {
    prefix: Arc<[u8]>,
    rank: u32,
    /// `(begin, end, entry)` in file offsets, in file order.
    pieces: Vec<(u64, u64, String)>,
    size: u64,
}

impl ShardFile {
    /// The file of rank `rank`'s shard `m`.
    pub(crate) fn new(rank: u32, m: &ShardManifest) -> Result<Self, CliError> {
        let (prefix, ranges) = crate::safetensors_io::shard_file(m)?;
        let base = prefix.len() as u64;
        let pieces: Vec<(u64, u64, String)> = ranges
            .iter()
            .zip(&m.entries)
            .map(|(&(b, e), entry)| (base + b, base + e, entry.name.clone()))
            .collect();
        let size = pieces.last().map_or(base, |p| p.1);
        Ok(ShardFile {
            prefix: prefix.into(),
            rank,
            pieces,
            size,
        })
    }

    /// The file's length.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The header bytes (shared: every read of the header is served
    /// from this one copy).
    pub(crate) fn header(&self) -> Arc<[u8]> {
        self.prefix.clone()
    }

    /// Where the bytes `[off, off + len)` come from.
    pub(crate) fn plan(&self, off: u64, len: u64) -> Vec<Part> {
        plan_pieces(self.prefix.len() as u64, self.rank, &self.pieces, off, len)
    }
}

/// One rank's piece of a global tensor: a box of it, row-major in the
/// entry, in bytes along the last dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Piece {
    rank: u32,
    entry: String,
    /// Offsets and lengths of the box in every dimension but the last.
    offsets: Vec<u64>,
    lengths: Vec<u64>,
    /// The box's first byte and length along a row (the last dimension).
    col0: u64,
    cols: u64,
}

/// A global tensor of [`ModelFile`].
struct ModelTensor {
    /// Its data's first byte in the file.
    begin: u64,
    len: u64,
    /// Every dimension but the last, and the bytes of one row.
    dims: Vec<u64>,
    row: u64,
    pieces: Vec<Piece>,
}

/// `model.safetensors`: the global tensors of a step by FQN, assembled
/// from every rank's pieces.
pub(crate) struct ModelFile {
    prefix: Arc<[u8]>,
    tensors: Vec<ModelTensor>,
    size: u64,
    /// FQNs left out, and why (pieces that do not tile the tensor).
    pub(crate) skipped: Vec<(String, String)>,
}

/// Whether any entry of `m` has a place in a global tensor: the step gets
/// a `model.safetensors`.
pub(crate) fn has_places(m: &ShardManifest) -> bool {
    !places(&m.metadata).is_empty()
}

impl ModelFile {
    /// The model file of a step from its shards (every rank's manifest);
    /// None when no entry has a place in a global tensor.
    pub(crate) fn new(shards: &[(u32, &ShardManifest)]) -> Result<Option<Self>, CliError> {
        struct Global {
            dtype: DType,
            shape: Vec<u64>,
            pieces: Vec<Piece>,
            bad: Option<String>,
        }
        let mut globals: BTreeMap<String, Global> = BTreeMap::new();
        for &(rank, m) in shards {
            for (entry, place) in places(&m.metadata) {
                let Some(e) = m.entry(&entry) else { continue };
                let EntryKind::Tensor { dtype, shape } = &e.kind else {
                    continue;
                };
                let g = globals.entry(place.fqn.clone()).or_insert_with(|| Global {
                    dtype: *dtype,
                    shape: place.shape.clone(),
                    pieces: Vec::new(),
                    bad: None,
                });
                let isz = dtype.size() as u64;
                // The global tensor's bytes must fit in u64: then every
                // offset and length below does too.
                let sized = place
                    .shape
                    .iter()
                    .try_fold(isz, |acc, &d| acc.checked_mul(d))
                    .is_some();
                let fits = sized
                    && shape.len() == place.shape.len()
                    && place
                        .offsets
                        .iter()
                        .zip(shape)
                        .zip(&place.shape)
                        .all(|((&o, &l), &g)| o.checked_add(l).is_some_and(|end| end <= g));
                if g.dtype != *dtype || g.shape != place.shape || !fits {
                    g.bad = Some(format!(
                        "rank {rank}'s piece {entry:?} ({} {shape:?} at {:?}) does not fit {} {:?}",
                        dtype.name(),
                        place.offsets,
                        g.dtype.name(),
                        g.shape
                    ));
                    continue;
                }
                // A scalar is one row of one element.
                let (offsets, lengths, col0, cols) = match shape.len() {
                    0 => (Vec::new(), Vec::new(), 0, isz),
                    d => (
                        place.offsets[..d - 1].to_vec(),
                        shape[..d - 1].to_vec(),
                        place.offsets[d - 1] * isz,
                        shape[d - 1] * isz,
                    ),
                };
                let p = Piece {
                    rank,
                    entry: entry.clone(),
                    offsets,
                    lengths,
                    col0,
                    cols,
                };
                // A replicated piece (the same box on several ranks) is
                // read from the first rank that holds it.
                if !g.pieces.iter().any(|q| {
                    q.offsets == p.offsets
                        && q.lengths == p.lengths
                        && q.col0 == p.col0
                        && q.cols == p.cols
                }) {
                    g.pieces.push(p);
                }
            }
        }
        if globals.is_empty() {
            return Ok(None);
        }
        let mut skipped = Vec::new();
        let mut kept: Vec<(String, DType, Vec<u64>, Vec<Piece>)> = Vec::new();
        for (fqn, g) in globals {
            let why = g
                .bad
                .clone()
                .or_else(|| tiling_error(&g.shape, g.dtype.size() as u64, &g.pieces));
            match why {
                Some(why) => skipped.push((fqn, why)),
                None => kept.push((fqn, g.dtype, g.shape, g.pieces)),
            }
        }
        let mut metadata = BTreeMap::new();
        metadata.insert("format".to_string(), "pt".to_string());
        let header: Vec<(&str, DType, &[u64])> = kept
            .iter()
            .map(|(n, d, s, _)| (n.as_str(), *d, s.as_slice()))
            .collect();
        let (prefix, ranges) = encode_header(&header, &metadata)?;
        let base = prefix.len() as u64;
        let tensors: Vec<ModelTensor> = kept
            .into_iter()
            .zip(ranges)
            .map(|((_, dtype, shape, pieces), (b, e))| {
                let isz = dtype.size() as u64;
                let (dims, row) = match shape.len() {
                    0 => (Vec::new(), isz),
                    d => (shape[..d - 1].to_vec(), shape[d - 1] * isz),
                };
                ModelTensor {
                    begin: base + b,
                    len: e - b,
                    dims,
                    row,
                    pieces,
                }
            })
            .collect();
        let size = tensors.last().map_or(base, |t| t.begin + t.len);
        Ok(Some(ModelFile {
            prefix: prefix.into(),
            tensors,
            size,
            skipped,
        }))
    }

    /// The file's length.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The header bytes (shared: every read of the header is served
    /// from this one copy).
    pub(crate) fn header(&self) -> Arc<[u8]> {
        self.prefix.clone()
    }

    /// Where the bytes `[off, off + len)` come from: runs of pieces,
    /// merged where both the file and the entry are contiguous.
    pub(crate) fn plan(&self, off: u64, len: u64) -> Vec<Part> {
        let end = off.saturating_add(len);
        let base = self.prefix.len() as u64;
        let mut out = Vec::new();
        if off < base {
            out.push(Part::Header {
                dst: 0,
                from: off as usize,
                len: (end.min(base) - off) as usize,
            });
        }
        let first = self.tensors.partition_point(|t| t.begin + t.len <= off);
        for t in &self.tensors[first..] {
            if t.begin >= end {
                break;
            }
            if t.row == 0 {
                continue; // no bytes
            }
            // Tensor-relative bytes asked for.
            let (x0, x1) = (
                off.max(t.begin) - t.begin,
                end.min(t.begin + t.len) - t.begin,
            );
            if x0 >= x1 {
                continue;
            }
            let mut idx = unravel(x0 / t.row, &t.dims);
            for r in x0 / t.row..=(x1 - 1) / t.row {
                let (lo, hi) = (
                    x0.max(r * t.row) - r * t.row,
                    x1.min((r + 1) * t.row) - r * t.row,
                );
                for p in &t.pieces {
                    if !contains(p, &idx) {
                        continue;
                    }
                    let (c0, c1) = (lo.max(p.col0), hi.min(p.col0 + p.cols));
                    if c0 >= c1 {
                        continue;
                    }
                    let local_row = local_row(p, &idx);
                    let at = local_row * p.cols + (c0 - p.col0);
                    let dst = (t.begin + r * t.row + c0 - off) as usize;
                    let n = (c1 - c0) as usize;
                    // Merge with the previous run when both sides continue.
                    if let Some(Part::Entry {
                        rank,
                        entry,
                        at: pat,
                        dst: pdst,
                        len: plen,
                    }) = out.last_mut()
                    {
                        if *rank == p.rank
                            && *entry == p.entry
                            && *pat + *plen as u64 == at
                            && *pdst + *plen == dst
                        {
                            *plen += n;
                            continue;
                        }
                    }
                    out.push(Part::Entry {
                        rank: p.rank,
                        entry: p.entry.clone(),
                        at,
                        dst,
                        len: n,
                    });
                }
                next_index(&mut idx, &t.dims);
            }
        }
        out
    }
}

/// Why `pieces` do not tile a tensor of `shape` exactly once (None: they
/// do). Their volumes must sum to the tensor's and no two may overlap.
fn tiling_error(shape: &[u64], isz: u64, pieces: &[Piece]) -> Option<String> {
    let whole: u128 = shape.iter().map(|&d| u128::from(d)).product::<u128>() * u128::from(isz);
    let vol = |p: &Piece| -> u128 {
        p.lengths.iter().map(|&d| u128::from(d)).product::<u128>() * u128::from(p.cols)
    };
    let sum: u128 = pieces.iter().map(vol).sum();
    if sum != whole {
        return Some(format!(
            "its pieces hold {sum} bytes of {whole} (a rank's pieces are missing?)"
        ));
    }
    // Pairwise disjoint (with the sum, that is a tiling). Quadratic: past
    // a few thousand pieces of one tensor, the sum alone is trusted.
    if pieces.len() <= 4096 {
        for (i, a) in pieces.iter().enumerate() {
            for b in &pieces[i + 1..] {
                let rows = a
                    .offsets
                    .iter()
                    .zip(&a.lengths)
                    .zip(b.offsets.iter().zip(&b.lengths))
                    .all(|((&ao, &al), (&bo, &bl))| ao < bo + bl && bo < ao + al);
                let cols = a.col0 < b.col0 + b.cols && b.col0 < a.col0 + a.cols;
                if rows && cols && vol(a) > 0 && vol(b) > 0 {
                    return Some(format!(
                        "pieces {:?} (rank {}) and {:?} (rank {}) overlap",
                        a.entry, a.rank, b.entry, b.rank
                    ));
                }
            }
        }
    }
    None
}

/// The multi-index of row `r` of a tensor whose leading dims are `dims`.
fn unravel(mut r: u64, dims: &[u64]) -> Vec<u64> {
    let mut idx = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        let d = dims[k].max(1);
        idx[k] = r % d;
        r /= d;
    }
    idx
}

/// Advances `idx` to the next row.
fn next_index(idx: &mut [u64], dims: &[u64]) {
    for k in (0..dims.len()).rev() {
        idx[k] += 1;
        if idx[k] < dims[k] {
            return;
        }
        idx[k] = 0;
    }
}

fn contains(p: &Piece, idx: &[u64]) -> bool {
    idx.iter()
        .zip(p.offsets.iter().zip(&p.lengths))
        .all(|(&i, (&o, &l))| i >= o && i < o + l)
}

/// The row of `idx` within piece `p` (row-major over its leading dims).
fn local_row(p: &Piece, idx: &[u64]) -> u64 {
    idx.iter()
        .zip(p.offsets.iter().zip(&p.lengths))
        .fold(0, |acc, (&i, (&o, &l))| acc * l + (i - o))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A global `[4, 6]` f32 tensor in two layouts: Shard(0) over 2 ranks
    /// and Shard(1) over 3; every byte planned lands where row-major
    /// order puts it.
    #[test]
    fn pieces_assemble_in_row_major_order() {
        for (pieces, name) in [
            (
                vec![
                    (0u32, vec![0u64], vec![2u64], 0u64, 6u64),
                    (1, vec![2], vec![2], 0, 6),
                ],
                "shard0",
            ),
            (
                vec![
                    (0, vec![0], vec![4], 0, 2),
                    (1, vec![0], vec![4], 2, 2),
                    (2, vec![0], vec![4], 4, 2),
                ],
                "shard1",
            ),
        ] {
            let isz = 4;
            let t = ModelTensor {
                begin: 0,
                len: 4 * 6 * isz,
                dims: vec![4],
                row: 6 * isz,
                pieces: pieces
                    .iter()
                    .map(|(rank, off, len, c0, n)| Piece {
                        rank: *rank,
                        entry: format!("e{rank}"),
                        offsets: off.clone(),
                        lengths: len.clone(),
                        col0: c0 * isz,
                        cols: n * isz,
                    })
                    .collect(),
            };
            assert_eq!(tiling_error(&[4, 6], isz, &t.pieces), None, "{name}");
            let f = ModelFile {
                prefix: Arc::from(Vec::new()),
                tensors: vec![t],
                size: 96,
                skipped: Vec::new(),
            };
            // Each piece's bytes hold (global element index) as u32; fill
            // every read from that and compare with row-major order.
            for (off, len) in [(0u64, 96u64), (5, 40), (23, 1), (50, 46)] {
                let mut buf = vec![0u8; len as usize];
                let mut filled = 0;
                for part in f.plan(off, len) {
                    let Part::Entry {
                        rank, at, dst, len, ..
                    } = part
                    else {
                        panic!("no header here")
                    };
                    let (_, po, pl, c0, n) = &pieces[rank as usize];
                    for k in 0..len {
                        // Byte `at + k` of the piece, as a global element.
                        let b = at + k as u64;
                        let (lr, lc) = (b / (n * isz), b % (n * isz));
                        let (gr, gc) = (po[0] + lr, c0 * isz + lc);
                        assert!(lr < pl[0]);
                        let g = (gr * 6 * isz + gc) as usize;
                        buf[dst + k] = (g % 251) as u8;
                    }
                    filled += len;
                }
                assert_eq!(filled, len as usize, "{name} {off}+{len}");
                let want: Vec<u8> = (off..off + len).map(|g| (g % 251) as u8).collect();
                assert_eq!(buf, want, "{name} {off}+{len}");
            }
        }
    }

    #[test]
    fn gaps_and_overlaps_are_not_a_tiling() {
        let p = |rank: u32, o: u64, l: u64| Piece {
            rank,
            entry: "e".into(),
            offsets: vec![o],
            lengths: vec![l],
            col0: 0,
            cols: 8,
        };
        assert_eq!(tiling_error(&[4, 2], 4, &[p(0, 0, 2), p(1, 2, 2)]), None);
        assert!(tiling_error(&[4, 2], 4, &[p(0, 0, 2)]).is_some());
        assert!(tiling_error(&[4, 2], 4, &[p(0, 0, 3), p(1, 1, 1)])
            .unwrap()
            .contains("overlap"));
    }

    #[test]
    fn header_then_pieces_in_order() {
        let parts = plan_pieces(8, 0, &[(8, 12, "a".into()), (12, 20, "b".into())], 6, 10);
        assert_eq!(
            parts,
            vec![
                Part::Header {
                    dst: 0,
                    from: 6,
                    len: 2
                },
                Part::Entry {
                    rank: 0,
                    entry: "a".into(),
                    at: 0,
                    dst: 2,
                    len: 4
                },
                Part::Entry {
                    rank: 0,
                    entry: "b".into(),
                    at: 0,
                    dst: 6,
                    len: 4
                },
            ]
        );
        assert!(plan_pieces(8, 0, &[(8, 12, "a".into())], 12, 4).is_empty());
    }
}
