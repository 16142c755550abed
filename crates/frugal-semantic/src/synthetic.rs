//! Synthetic embeddings for the index's tests and benchmark: unit vectors of MiniLM's width,
//! isotropic or drawn around topics, from a seeded generator so every run sees the same data.

/// all-MiniLM-L6-v2's width.
pub const DIM: usize = 384;

/// splitmix64, with normal draws (Box-Muller).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn normal(&mut self) -> f32 {
        let u = ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let v = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }

    /// A direction drawn uniformly.
    pub fn unit(&mut self) -> Vec<f32> {
        normalized((0..DIM).map(|_| self.normal()).collect())
    }

    /// `v` moved by noise of norm `by`, normalised again.
    pub fn jitter(&mut self, v: &[f32], by: f32) -> Vec<f32> {
        let s = by / (DIM as f32).sqrt();
        normalized(v.iter().map(|x| x + s * self.normal()).collect())
    }
}

/// A unit vector of width `dim` from `seed` (xorshift, uniform in each coordinate): cheap,
/// reproducible and of any width, for the flat index's tests.
pub fn seeded_unit(seed: u64, dim: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    normalized(
        (0..dim)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect(),
    )
}

pub fn normalized(v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

/// Topics: a centre and 32 directions of spread each, plus a little noise in every direction.
/// Sentence embeddings lie on such low-dimensional patches; isotropic noise is the hard case.
pub struct Topics(Vec<(Vec<f32>, Vec<Vec<f32>>)>);

impl Topics {
    pub fn new(rng: &mut Rng, n: usize) -> Topics {
        Topics(
            (0..n)
                .map(|_| (rng.unit(), (0..32).map(|_| rng.unit()).collect()))
                .collect(),
        )
    }

    pub fn point(&self, rng: &mut Rng) -> Vec<f32> {
        let (centre, axes) = &self.0[(rng.next_u64() % self.0.len() as u64) as usize];
        let mut v = centre.clone();
        for axis in axes {
            let w = 0.25 * rng.normal();
            for (x, a) in v.iter_mut().zip(axis) {
                *x += w * a;
            }
        }
        rng.jitter(&v, 0.5)
    }
}
