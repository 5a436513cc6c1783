//! What makes the CPU kernels' loops vector code: a dispatch that compiles them for the best
//! instruction set the machine has, and an `exp` that vectorises.
//!
//! A kernel is a [`Kernel`]: its arguments in a struct and its loops in `run`, plain loops
//! over slices (iterators and `zip`, so no bounds checks per element), every function it
//! calls `#[inline(always)]`. [`vectorized`] hands it to `pulp`, which detects AVX-512
//! (x86-64-v4) or else AVX2 + FMA once and calls `run` from a function compiled with them
//! enabled; `run` and everything it calls must be inlined into that function to be compiled
//! with them, which is why kernels are not closures (a closure's body is a function of its
//! own that the compiler may keep out of line, compiled without the features). LLVM then
//! vectorises the loops. Without AVX2 the same code runs with SSE2.

/// A CPU kernel: arguments in `self`, loops in `run`.
pub(crate) trait Kernel {
    /// What it returns.
    type Output;
    /// Runs it; implementations are `#[inline(always)]`.
    fn run(self) -> Self::Output;
}

struct Dispatch<K>(K);

impl<K: Kernel> pulp::WithSimd for Dispatch<K> {
    type Output = K::Output;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> K::Output {
        self.0.run()
    }
}

/// Runs `kernel` compiled for the best instruction set this CPU supports.
pub(crate) fn vectorized<K: Kernel>(kernel: K) -> K::Output {
    pulp::Arch::new().dispatch(Dispatch(kernel))
}

/// `Σ f(x)` in eight independent lanes, so that it vectorises (one `f32` accumulator is a
/// chain the compiler may not reorder).
#[inline(always)]
pub(crate) fn sum_map(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let chunks = xs.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|&x| f(x)).sum();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += f(x);
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `Σ x`, as [`sum_map`].
#[inline(always)]
pub(crate) fn sum(xs: &[f32]) -> f32 {
    sum_map(xs, |x| x)
}

/// `Σ aᵢ·bᵢ` over the shorter of the two, in eight independent lanes.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((lane, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *lane += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `e^x` in f32 with a relative error below 3 × 10⁻⁷ (two units in the last place), written so that a loop of it
/// vectorises (the standard library's `expf` is a call per element).
///
/// Range reduction `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (rounding by the 1.5 · 2²³ trick,
/// which needs no `round` instruction), a degree-6 polynomial for `e^r`, and `2ⁿ` built in
/// the exponent bits. Inputs are clamped to the normal range: below −87.3 the result is
/// ≈ 1.2 × 10⁻³⁸ instead of a denormal or 0, which no sum of probabilities can see.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer.
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.3, 88.7);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    // Cody–Waite: `n · LN2_HI` is exact, so `r` keeps its low bits.
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor coefficients 1/k! to degree 6, by Horner: error below 1.1e-7 on |r| ≤ 0.347.
    // Plain multiply-adds, not `mul_add`: without FMA hardware that is a library call.
    let p = r * (1.0 / 720.0) + 1.0 / 120.0;
    let p = r * p + 1.0 / 24.0;
    let p = r * p + 1.0 / 6.0;
    let p = r * p + 0.5;
    let p = r * p + 1.0;
    let p = r * p + 1.0;
    let n = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let scale = f32::from_bits(((n + 127) << 23) as u32);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_the_standard_library() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_7;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1.0e9) < 1.3e-38 && exp(-1.0e9) > 0.0);
    }
}
