//! Deterministic pseudo-random numbers for the tests: two small generators (the tests that use
//! each depend on its exact sequence: a seed replays a run) and pseudo-random bytes.

/// xorshift64 (shifts 13, 7, 17). The state is the seed as given: it must not be 0.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform-ish in [0, n) (n must not be 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// splitmix64: small and good enough for test sequences. Each test that uses it salts its
/// seeds with its own constant (`SplitMix::salted`), so that two tests given one seed do not
/// make the same choices.
pub struct SplitMix(pub u64);

impl SplitMix {
    /// Starts from `seed ^ salt`.
    pub fn salted(seed: u64, salt: u64) -> SplitMix {
        SplitMix(seed ^ salt)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, n) (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// Uniform in [lo, hi] (inclusive).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability num/den.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// One element of `v`, uniformly.
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }

    /// 0 to `max` bytes (inclusive), one `next()` a byte.
    pub fn bytes(&mut self, max: u64) -> Vec<u8> {
        let n = self.below(max + 1) as usize;
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// `len` bytes, 8 from each `next()`.
    pub fn fill(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

/// Deterministic pseudo-random bytes, 8 at a time (xorshift64 from a salted seed): fast enough
/// in a debug build, where a byte-at-a-time generator is not.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    if x == 0 {
        x = 1;
    }
    let mut out = vec![0u8; len];
    for c in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    out
}
