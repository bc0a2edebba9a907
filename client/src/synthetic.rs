//! A deterministic synthetic training state of mixed dtypes, shaped like a
//! mixed-precision transformer checkpoint: bf16 weights, fp32 master weights
//! and Adam moments, an fp16 embedding, fp8 and int tensors, small norms and
//! biases, a step counter and an opaque data-loader blob.
//!
//! Values follow the distributions that matter to the codecs (weights are
//! near-normal with a small standard deviation, so their exponents cluster),
//! and every byte is a pure function of (seed, entry, position): the same
//! spec always gives the same bytes, on any number of threads.

use strata_format::{DType, EntrySpec};

/// One synthetic entry: its spec and how its values are drawn.
#[derive(Clone, Debug)]
pub struct SynthEntry {
    /// Name, dtype and shape.
    pub spec: EntrySpec,
    /// Value distribution.
    pub fill: Fill,
}

/// How an entry's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fill {
    /// Near-normal floats with this standard deviation.
    Normal(f32),
    /// Squares of near-normal floats with this standard deviation (Adam's
    /// second moment: positive, wide range).
    NormalSquared(f32),
    /// Floats near 1.0 (norm weights).
    NearOne,
    /// Integers uniform in `[0, n)`.
    UniformInt(u64),
    /// Random bytes (incompressible).
    Random,
    /// A single constant integer.
    Constant(u64),
}

/// The entries of a synthetic state of about `total_bytes`, as `layers`
/// transformer layers of hidden size chosen to fit.
pub fn entries(total_bytes: u64) -> Vec<SynthEntry> {
    // Per parameter: bf16 weight (2) + fp32 master (4) + two fp32 moments (8).
    const BYTES_PER_PARAM: u64 = 14;
    let body = total_bytes.saturating_mul(9) / 10;
    let layers_hint: u64 = if total_bytes >= 256 << 20 { 12 } else { 2 };
    // 12 h^2 parameters per layer (attention 4 h^2, MLP 8 h^2).
    let h = (((body / layers_hint / BYTES_PER_PARAM / 12) as f64).sqrt() as u64 / 64 * 64).max(64);
    // As many layers of that width as fill the body.
    let layer_bytes = 12 * h * h * BYTES_PER_PARAM;
    let layers = ((body + layer_bytes / 2) / layer_bytes).max(1);
    let vocab = (total_bytes / 20 / 2 / h).max(64) / 64 * 64;
    let mut out = Vec::new();
    let mut t = |name: String, dtype: DType, shape: Vec<u64>, fill: Fill| {
        if let Ok(spec) = EntrySpec::tensor(name, dtype, shape) {
            out.push(SynthEntry { spec, fill });
        }
    };
    t(
        "model.embed_tokens.weight".into(),
        DType::F16,
        vec![vocab, h],
        Fill::Normal(0.02),
    );
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let mats: [(&str, u64, u64); 6] = [
            ("self_attn.q_proj", h, h),
            ("self_attn.k_proj", h, h),
            ("self_attn.v_proj", h, h),
            ("self_attn.o_proj", h, h),
            ("mlp.up_proj", 4 * h, h),
            ("mlp.down_proj", h, 4 * h),
        ];
        for (m, r, c) in mats {
            t(
                format!("{p}.{m}.weight"),
                DType::BF16,
                vec![r, c],
                Fill::Normal(0.02),
            );
            t(
                format!("optim.{p}.{m}.master"),
                DType::F32,
                vec![r, c],
                Fill::Normal(0.02),
            );
            t(
                format!("optim.{p}.{m}.exp_avg"),
                DType::F32,
                vec![r, c],
                Fill::Normal(1e-3),
            );
            t(
                format!("optim.{p}.{m}.exp_avg_sq"),
                DType::F32,
                vec![r, c],
                Fill::NormalSquared(1e-3),
            );
        }
        t(
            format!("{p}.input_layernorm.weight"),
            DType::BF16,
            vec![h],
            Fill::NearOne,
        );
        t(
            format!("{p}.post_attention_layernorm.weight"),
            DType::BF16,
            vec![h],
            Fill::NearOne,
        );
        t(
            format!("{p}.mlp.up_proj.bias"),
            DType::F32,
            vec![4 * h],
            Fill::Normal(0.01),
        );
        t(
            format!("{p}.mlp.up_proj.weight_fp8"),
            DType::F8_E4M3,
            vec![4 * h, h / 8],
            Fill::Random,
        );
    }
    t(
        "model.norm.weight".into(),
        DType::BF16,
        vec![h],
        Fill::NearOne,
    );
    t(
        "train.token_buffer".into(),
        DType::I32,
        vec![16, 2048],
        Fill::UniformInt(50_000),
    );
    t(
        "train.attention_mask".into(),
        DType::BOOL,
        vec![16, 2048],
        Fill::UniformInt(2),
    );
    t(
        "train.step".into(),
        DType::I64,
        vec![],
        Fill::Constant(1000),
    );
    out.push(SynthEntry {
        spec: EntrySpec::blob("train.dataloader_state", 48 << 10),
        fill: Fill::Random,
    });
    out
}

/// The workspace's one generator (`strata_tiered::SplitMix64`), with the
/// near-normal draw the synthetic weights need.
struct SplitMix(strata_tiered::SplitMix64);

impl SplitMix {
    fn new(seed: u64) -> Self {
        SplitMix(strata_tiered::SplitMix64::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A near-normal value with unit variance: the Irwin-Hall sum of four
    /// 16-bit uniforms, which is cheap and close enough for exponent statistics.
    fn normal(&mut self) -> f32 {
        let r = self.next();
        let s: u64 = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
        ((s as f64 - 2.0 * 65535.5) / 37_837.0) as f32
    }
}

/// Bytes are generated in blocks seeded independently, so any block can be
/// produced on any thread.
pub const BLOCK: usize = 64 << 10;

fn block_seed(seed: u64, entry: usize, block: usize) -> u64 {
    let mut m = SplitMix::new(
        seed ^ (entry as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (block as u64).rotate_left(32),
    );
    m.next()
}

/// Fills one [`BLOCK`]-aligned block of entry `entry`'s bytes. `block` is the
/// block index; `out` is at most [`BLOCK`] bytes (the entry's tail may be
/// shorter).
pub fn fill_block(e: &SynthEntry, seed: u64, entry: usize, block: usize, out: &mut [u8]) {
    let mut rng = SplitMix::new(block_seed(seed, entry, block));
    let dtype = match &e.spec.kind {
        strata_format::EntryKind::Tensor { dtype, .. } => Some(*dtype),
        strata_format::EntryKind::Blob => None,
    };
    let f32_value = |rng: &mut SplitMix| -> f32 {
        match e.fill {
            Fill::Normal(sd) => rng.normal() * sd,
            Fill::NormalSquared(sd) => {
                let v = rng.normal() * sd;
                v * v
            }
            Fill::NearOne => 1.0 + rng.normal() * 0.05,
            Fill::UniformInt(n) => (rng.next() % n.max(1)) as f32,
            Fill::Random => f32::from_bits(rng.next() as u32),
            Fill::Constant(c) => c as f32,
        }
    };
    match (dtype, e.fill) {
        (_, Fill::Random) | (None, _) => {
            for c in out.chunks_mut(8) {
                let v = rng.next().to_le_bytes();
                c.copy_from_slice(&v[..c.len()]);
            }
        }
        (Some(d), Fill::UniformInt(n)) | (Some(d), Fill::Constant(n)) if !d.is_float() => {
            let size = d.size();
            let constant = matches!(e.fill, Fill::Constant(_));
            for c in out.chunks_mut(size) {
                let v = if constant { n } else { rng.next() % n.max(1) };
                let b = v.to_le_bytes();
                c.copy_from_slice(&b[..c.len()]);
            }
        }
        (Some(DType::F32), _) => {
            for c in out.chunks_mut(4) {
                let b = f32_value(&mut rng).to_le_bytes();
                c.copy_from_slice(&b[..c.len()]);
            }
        }
        (Some(DType::F64), _) => {
            for c in out.chunks_mut(8) {
                let b = f64::from(f32_value(&mut rng)).to_le_bytes();
                c.copy_from_slice(&b[..c.len()]);
            }
        }
        (Some(DType::BF16), _) => {
            for c in out.chunks_mut(2) {
                let b = bf16_bits(f32_value(&mut rng)).to_le_bytes();
                c.copy_from_slice(&b[..c.len()]);
            }
        }
        (Some(DType::F16), _) => {
            for c in out.chunks_mut(2) {
                let b = f16_bits(f32_value(&mut rng)).to_le_bytes();
                c.copy_from_slice(&b[..c.len()]);
            }
        }
        (Some(_), _) => {
            for c in out.chunks_mut(8) {
                let v = rng.next().to_le_bytes();
                c.copy_from_slice(&v[..c.len()]);
            }
        }
    }
}

/// Fills a whole entry's bytes.
pub fn fill_entry(e: &SynthEntry, seed: u64, entry: usize, out: &mut [u8]) {
    for (b, chunk) in out.chunks_mut(BLOCK).enumerate() {
        fill_block(e, seed, entry, b, chunk);
    }
}

/// bf16 from f32, rounding to nearest even (as frameworks convert).
pub fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return 0x7FC0;
    }
    let round = 0x7FFF + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// IEEE binary16 from f32 (round to nearest, flush tiny values to zero, clamp
/// to infinity): good enough for synthetic data.
pub fn f16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xFF) as i32 - 127 + 15;
    let man = b & 0x7F_FFFF;
    if exp <= 0 {
        sign
    } else if exp >= 31 {
        sign | 0x7C00
    } else {
        let m = (man + 0x1000) >> 13;
        (sign | ((exp as u16) << 10)).wrapping_add(m as u16)
    }
}

/// Borrows `data` (one buffer per spec, in order) as the entries of a save.
pub fn as_entries<'a>(specs: &'a [EntrySpec], data: &'a [Vec<u8>]) -> Vec<crate::Entry<'a>> {
    specs
        .iter()
        .zip(data)
        .map(|(s, d)| match &s.kind {
            strata_format::EntryKind::Tensor { dtype, shape } => {
                crate::Entry::tensor(&s.name, *dtype, shape, d)
            }
            strata_format::EntryKind::Blob => crate::Entry::blob(&s.name, d),
        })
        .collect()
}

/// The entries of a synthetic state of about `total_bytes` and their bytes
/// for `seed`, generated on `threads` threads.
pub fn generate(total_bytes: u64, seed: u64, threads: usize) -> (Vec<EntrySpec>, Vec<Vec<u8>>) {
    let entries = entries(total_bytes);
    let data = crate::par::par_map(
        entries.len(),
        threads,
        || (),
        |_, i| {
            let mut v = vec![0u8; entries[i].spec.len as usize];
            fill_entry(&entries[i], seed, i, &mut v);
            v
        },
    );
    (entries.into_iter().map(|e| e.spec).collect(), data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_track_the_request_and_bytes_are_deterministic() {
        for total in [4u64 << 20, 64 << 20, 2 << 30] {
            let es = entries(total);
            let sum: u64 = es.iter().map(|e| e.spec.len).sum();
            assert!(sum > total / 2 && sum < total * 3 / 2, "{total} -> {sum}");
        }
        let es = entries(4 << 20);
        let e = &es[1];
        let mut a = vec![0u8; e.spec.len as usize];
        let mut b = vec![0u8; e.spec.len as usize];
        fill_entry(e, 7, 1, &mut a);
        fill_entry(e, 7, 1, &mut b);
        assert_eq!(a, b);
        fill_entry(e, 8, 1, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn conversions() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        assert_eq!(bf16_bits(-2.0), 0xC000);
        assert_eq!(f16_bits(1.0), 0x3C00);
        assert_eq!(f16_bits(-2.0), 0xC000);
    }
}
