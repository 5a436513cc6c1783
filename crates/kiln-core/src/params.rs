//! Whole-model summaries of parameters: checksums to compare runs, and exact fingerprints to
//! compare replicas.

use std::marker::PhantomData;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Tensor, backend::Backend};

/// The f64 sum and sum of squares of every float parameter value of a model: equal
/// checksums for equal models, and a cheap fingerprint to compare runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ParamChecksum {
    /// Sum of all values.
    pub sum: f64,
    /// Sum of all squared values.
    pub sq_sum: f64,
    /// Number of values.
    pub count: u64,
}

/// Reads every float parameter of `module` to the host and sums it in f64.
pub fn checksum<B: Backend, M: Module<B>>(module: &M) -> ParamChecksum {
    let mut visitor = HostChecksum::<B> {
        sum: ParamChecksum::default(),
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    visitor.sum
}

struct HostChecksum<B> {
    sum: ParamChecksum,
    backend: PhantomData<B>,
}

impl<B: Backend> ModuleVisitor<B> for HostChecksum<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let data = param.val().into_data().convert::<f64>();
        for v in data.iter::<f64>() {
            self.sum.sum += v;
            self.sum.sq_sum += v * v;
            self.sum.count += 1;
        }
    }
}

/// The bytes a module's parameters occupy, and their gradients during a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParamBytes {
    /// Every parameter: float and integer (a 4-bit base's packed codes), trainable or frozen.
    pub params: u64,
    /// The trainable float parameters, whose gradients a step holds (in their dtype).
    pub grads: u64,
}

/// The [`ParamBytes`] of `module`, from its tensors' shapes and dtypes (a tied parameter
/// once): exact, and read without touching the data.
pub fn param_bytes<B: Backend, M: Module<B>>(module: &M) -> ParamBytes {
    struct Count<B> {
        bytes: ParamBytes,
        seen: std::collections::HashSet<burn::module::ParamId>,
        backend: PhantomData<B>,
    }
    impl<B: Backend> ModuleVisitor<B> for Count<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.seen.insert(param.id) {
                let t = param.val();
                let bytes = (t.shape().num_elements() * t.dtype().size()) as u64;
                self.bytes.params += bytes;
                if t.is_require_grad() {
                    self.bytes.grads += bytes;
                }
            }
        }

        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, burn::tensor::Int>>) {
            if self.seen.insert(param.id) {
                let t = param.val();
                self.bytes.params += (t.shape().num_elements() * t.dtype().size()) as u64;
            }
        }
    }
    let mut count = Count::<B> {
        bytes: ParamBytes::default(),
        seen: std::collections::HashSet::new(),
        backend: PhantomData,
    };
    module.visit(&mut count);
    count.bytes
}

/// The exact bits of one float parameter, hashed: equal for bit-identical values (and the same
/// shape and dtype), different for any other values up to hash collisions (2⁻⁶⁴).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamFingerprint {
    /// The parameter's module path (`blocks.0.attn.query.weight`).
    pub path: String,
    /// A 64-bit hash of its dtype, shape and bytes.
    pub hash: u64,
}

/// The [`ParamFingerprint`] of every float parameter of `module`, in visiting order (a tied
/// parameter once).
///
/// This is how replicas are compared: exactly, and with no float arithmetic. A checksum summed
/// on the device cannot do it. A sum of many values absorbs a difference in the last bit of
/// one of them. And a device reduction need not be deterministic: CubeCL's full `sum` on CUDA
/// adds with atomics, so identical replicas can get checksums that differ in the last bit.
/// The values are read to the host, which costs one device synchronisation and a copy of the
/// parameters: a check to run every so many steps, not every step of a long run.
pub fn fingerprints<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamFingerprint> {
    fingerprints_except(module, Default::default())
}

/// [`fingerprints`] of every float parameter but those in `skip`.
pub(crate) fn fingerprints_except<B: Backend, M: Module<B>>(
    module: &M,
    skip: std::collections::HashSet<burn::module::ParamId>,
) -> Vec<ParamFingerprint> {
    let mut visitor = Fingerprints::<B> {
        stack: Vec::new(),
        // A parameter counts as seen once: the skipped ones are seen from the start.
        seen: skip,
        found: Vec::new(),
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    visitor.found
}

struct Fingerprints<B> {
    stack: Vec<String>,
    seen: std::collections::HashSet<burn::module::ParamId>,
    found: Vec<ParamFingerprint>,
    backend: PhantomData<B>,
}

impl<B: Backend> ModuleVisitor<B> for Fingerprints<B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.stack.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        use std::hash::{Hash, Hasher};
        if !self.seen.insert(param.id) {
            return;
        }
        let data = param.val().into_data();
        // SipHash with fixed keys: the same in every thread and process of one build.
        let mut hasher = std::hash::DefaultHasher::new();
        format!("{:?}", data.dtype).hash(&mut hasher);
        data.shape.hash(&mut hasher);
        data.as_bytes().hash(&mut hasher);
        self.found.push(ParamFingerprint {
            path: self.stack.join("."),
            hash: hasher.finish(),
        });
    }
}

/// The module path of `module`'s float parameter `id` (`layers.0.attn.q_proj.weight`), or its
/// id where the module holds none.
pub(crate) fn param_path<B: Backend, M: Module<B>>(
    module: &M,
    id: burn::module::ParamId,
) -> String {
    struct Find<B> {
        stack: Vec<String>,
        id: burn::module::ParamId,
        found: Option<String>,
        backend: PhantomData<B>,
    }
    impl<B: Backend> ModuleVisitor<B> for Find<B> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.stack.push(name.to_string());
        }

        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.stack.pop();
        }

        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if param.id == self.id && self.found.is_none() {
                self.found = Some(self.stack.join("."));
            }
        }
    }
    let mut find = Find::<B> {
        stack: Vec::new(),
        id,
        found: None,
        backend: PhantomData,
    };
    module.visit(&mut find);
    find.found.unwrap_or_else(|| id.to_string())
}

/// `hashes` as floats that a collective moves exactly: four 16-bit pieces per hash, each an
/// integer below 2¹⁶ (exact in f32, and in the bf16 or f16 of no collective Kiln uses).
pub(crate) fn hashes_to_floats(hashes: impl IntoIterator<Item = u64>) -> Vec<f32> {
    hashes
        .into_iter()
        .flat_map(|h| (0..4).map(move |i| ((h >> (16 * i)) & 0xffff) as f32))
        .collect()
}

/// The inverse of [`hashes_to_floats`].
pub(crate) fn floats_to_hashes(floats: &[f32]) -> Vec<u64> {
    floats
        .chunks(4)
        .map(|piece| {
            piece
                .iter()
                .enumerate()
                .fold(0u64, |h, (i, &v)| h | ((v as u64) << (16 * i)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::TensorData;

    use super::*;

    /// `linear` with the weight's element `at` replaced by `value`.
    fn with_weight(linear: &Linear<Flex>, edit: impl FnOnce(&mut Vec<f32>)) -> Linear<Flex> {
        let weight = linear.weight.val();
        let dims = weight.dims();
        let mut values = weight.into_data().to_vec::<f32>().unwrap();
        edit(&mut values);
        let mut changed = linear.clone();
        changed.weight = changed
            .weight
            .map(|w| Tensor::from_data(TensorData::new(values, dims), &w.device()));
        changed
    }

    #[test]
    fn one_ulp_anywhere_changes_the_fingerprint() {
        let device = Default::default();
        let linear = LinearConfig::new(64, 64)
            .init::<Flex>(&device)
            .fork(&device);
        let same = fingerprints::<Flex, _>(&linear.clone());
        assert_eq!(same, fingerprints::<Flex, _>(&linear));
        assert_eq!(
            same.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            ["weight", "bias"]
        );
        // The last bit of one small value: a sum of the 4096 weights in f32 absorbs it.
        let nudged = with_weight(&linear, |w| {
            let small = w.iter().position(|v| v.abs() < 1e-3).unwrap();
            w[small] = f32::from_bits(w[small].to_bits() + 1);
        });
        let found = fingerprints::<Flex, _>(&nudged);
        assert_ne!(found[0], same[0]);
        assert_eq!(found[1], same[1]);
        // Two values swapped: every order-free sum is the same.
        let swapped = with_weight(&linear, |w| w.swap(0, 1));
        assert_ne!(fingerprints::<Flex, _>(&swapped)[0], same[0]);
    }

    #[test]
    fn hashes_travel_as_floats_exactly() {
        let hashes = [0, u64::MAX, 0x0123_4567_89ab_cdef];
        let floats = hashes_to_floats(hashes);
        assert_eq!(floats.len(), 12);
        assert_eq!(floats_to_hashes(&floats), hashes);
    }
}

/// What identifies a model's parameters without their values: see [`signature`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSignature {
    /// Parameter tensors (float, integer and bool).
    pub tensors: usize,
    /// Parameter values.
    pub parameters: u64,
    /// The first 16 hex digits of the SHA-256 of every parameter's path, shape and dtype, in
    /// the module's order.
    pub digest: String,
}

/// The [`ModelSignature`] of `module`: two models of one architecture and size share it, and
/// a checkpoint of another model is told apart before any value is read.
pub fn signature<B: Backend, M: Module<B>>(module: &M) -> ModelSignature {
    use sha2::{Digest, Sha256};

    struct Layout<B> {
        path: Vec<String>,
        hasher: Sha256,
        tensors: usize,
        parameters: u64,
        backend: PhantomData<B>,
    }
    impl<B: Backend> Layout<B> {
        fn add(&mut self, kind: &str, dims: &[usize], dtype: burn::tensor::DType) {
            let line = format!("{} {kind} {dims:?} {dtype:?}\n", self.path.join("."));
            self.hasher.update(line.as_bytes());
            self.tensors += 1;
            self.parameters += dims.iter().product::<usize>() as u64;
        }
    }
    impl<B: Backend> ModuleVisitor<B> for Layout<B> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            self.add("float", &t.dims(), t.dtype());
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, burn::tensor::Int>>) {
            let t = param.val();
            self.add("int", &t.dims(), t.dtype());
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, burn::tensor::Bool>>) {
            let t = param.val();
            self.add("bool", &t.dims(), t.dtype());
        }
    }
    let mut layout = Layout::<B> {
        path: Vec::new(),
        hasher: Sha256::new(),
        tensors: 0,
        parameters: 0,
        backend: PhantomData,
    };
    module.visit(&mut layout);
    let digest = layout.hasher.finalize();
    ModelSignature {
        tensors: layout.tensors,
        parameters: layout.parameters,
        digest: digest[..8].iter().map(|b| format!("{b:02x}")).collect(),
    }
}
