//! Byte-plane split and join.
//!
//! For elements of N bytes, plane k holds byte k (little-endian) of every
//! element. Float exponents sit in the high bytes, so those planes are
//! low-entropy and compress well while the mantissa planes stay near-random
//! (the observation behind ZipNN).
//!
//! Optionally each element is first rotated left by one bit. For BF16 and F32
//! this moves the sign bit to bit 0 and leaves the whole 8-bit exponent in the
//! top byte, so the exponent plane holds nothing but exponents.

/// How elements are transformed before the split. Stored in the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transform {
    /// Bytes split as they are.
    None = 0,
    /// Each element rotated left by one bit before the split.
    RotateLeft1 = 1,
}

impl Transform {
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Transform::None),
            1 => Some(Transform::RotateLeft1),
            _ => None,
        }
    }
}

// Split and join are written once per element width with the rotation as a
// const parameter, and every plane re-sliced to exactly `count` bytes, so the
// compiler drops the bounds checks and vectorises the loops.
macro_rules! split_join {
    ($split:ident, $join:ident, $ty:ty, $n:literal) => {
        fn $split<const R: u32>(raw: &[u8], planes: &mut [u8]) {
            let count = raw.len() / $n;
            let outs: [&mut [u8]; $n] = split_n(&mut planes[..count * $n], count);
            for (i, c) in raw.chunks_exact($n).enumerate().take(count) {
                let mut b = [0u8; $n];
                b.copy_from_slice(c);
                let v = <$ty>::from_le_bytes(b).rotate_left(R).to_le_bytes();
                for k in 0..$n {
                    outs[k][i] = v[k];
                }
            }
        }

        fn $join<const R: u32>(planes: &[&[u8]], dst: &mut [u8]) {
            let count = dst.len() / $n;
            let ins: [&[u8]; $n] = std::array::from_fn(|k| &planes[k][..count]);
            for (i, c) in dst.chunks_exact_mut($n).enumerate().take(count) {
                let mut b = [0u8; $n];
                for k in 0..$n {
                    b[k] = ins[k][i];
                }
                c.copy_from_slice(&<$ty>::from_le_bytes(b).rotate_right(R).to_le_bytes());
            }
        }
    };
}

/// Splits `buf` (of length `n * count`) into `n` disjoint planes of `count`.
fn split_n<const N: usize>(buf: &mut [u8], count: usize) -> [&mut [u8]; N] {
    let mut rest = buf;
    std::array::from_fn(|_| {
        let (a, b) = std::mem::take(&mut rest).split_at_mut(count);
        rest = b;
        a
    })
}

split_join!(split2, join2, u16, 2);
split_join!(split4, join4, u32, 4);
split_join!(split8, join8, u64, 8);

/// Splits `raw` into `elem` planes, written one after another into `planes`
/// (same length as `raw`). `raw.len()` must be a multiple of `elem`, which is
/// 2, 4 or 8; the caller checks both.
pub(crate) fn split(raw: &[u8], elem: usize, t: Transform, planes: &mut [u8]) {
    match (elem, t) {
        (2, Transform::None) => split2::<0>(raw, planes),
        (2, Transform::RotateLeft1) => split2::<1>(raw, planes),
        (4, Transform::None) => split4::<0>(raw, planes),
        (4, Transform::RotateLeft1) => split4::<1>(raw, planes),
        (8, Transform::None) => split8::<0>(raw, planes),
        (8, Transform::RotateLeft1) => split8::<1>(raw, planes),
        _ => planes.copy_from_slice(raw),
    }
}

/// Inverse of [`split`]: interleaves the planes back into `dst`.
pub(crate) fn join(planes: &[&[u8]], t: Transform, dst: &mut [u8]) {
    match (planes.len(), t) {
        (2, Transform::None) => join2::<0>(planes, dst),
        (2, Transform::RotateLeft1) => join2::<1>(planes, dst),
        (4, Transform::None) => join4::<0>(planes, dst),
        (4, Transform::RotateLeft1) => join4::<1>(planes, dst),
        (8, Transform::None) => join8::<0>(planes, dst),
        (8, Transform::RotateLeft1) => join8::<1>(planes, dst),
        _ => {
            if let Some(p) = planes.first() {
                dst.copy_from_slice(p);
            }
        }
    }
}

/// Order-0 Shannon entropy, in bits per byte, of a sample of `plane`: up to
/// four 4 KiB windows spread across it. Used to skip compressing planes that
/// cannot shrink (the mantissa planes), which costs time and gains nothing.
pub(crate) fn sampled_entropy(plane: &[u8]) -> f64 {
    const WINDOW: usize = 4096;
    const WINDOWS: usize = 4;
    let mut hist = [0u32; 256];
    let mut total = 0u64;
    if plane.len() <= WINDOW * WINDOWS {
        for &b in plane {
            hist[usize::from(b)] += 1;
        }
        total = plane.len() as u64;
    } else {
        let stride = (plane.len() - WINDOW) / (WINDOWS - 1);
        for w in 0..WINDOWS {
            for &b in &plane[w * stride..w * stride + WINDOW] {
                hist[usize::from(b)] += 1;
            }
            total += WINDOW as u64;
        }
    }
    entropy_of(&hist, total)
}

/// Shannon entropy in bits per symbol of a byte histogram.
pub fn entropy_of(hist: &[u32; 256], total: u64) -> f64 {
    if total == 0 {
        return 0.0;
    }
    let t = total as f64;
    hist.iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / t;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_join_round_trips_every_width_and_transform() {
        let raw: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for elem in [2usize, 4, 8] {
            for t in [Transform::None, Transform::RotateLeft1] {
                let mut planes = vec![0u8; raw.len()];
                split(&raw, elem, t, &mut planes);
                let n = raw.len() / elem;
                let views: Vec<&[u8]> = planes.chunks_exact(n).collect();
                let mut back = vec![0u8; raw.len()];
                join(&views, t, &mut back);
                assert_eq!(back, raw, "elem {elem} {t:?}");
            }
        }
    }

    #[test]
    fn rotation_puts_the_bf16_exponent_in_the_high_plane() {
        // 1.0 in bf16 is 0x3F80: sign 0, exponent 127, mantissa 0; -1.0 is 0xBF80.
        let raw = [0x80, 0x3F, 0x80, 0xBF];
        let mut planes = [0u8; 4];
        split(&raw, 2, Transform::RotateLeft1, &mut planes);
        assert_eq!(
            &planes[2..],
            &[127, 127],
            "high plane is the exponent alone"
        );
        assert_eq!(
            &planes[..2],
            &[0, 1],
            "the sign moved to bit 0 of the low plane"
        );
    }

    #[test]
    fn entropy_bounds() {
        assert_eq!(sampled_entropy(&[7u8; 100_000]), 0.0);
        let uniform: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
        assert!((sampled_entropy(&uniform) - 8.0).abs() < 1e-9);
    }
}
