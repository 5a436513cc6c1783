//! How the multi-tensor kernels (the fused AdamW, the casts, the global norm) cut their tensors
//! into launches: a runtime binds a bounded number of buffers to one launch (1,024 on CUDA, 31
//! on wgpu), and a launch is compiled for one dtype.

use burn_cubecl::CubeRuntime;
use cubecl::client::ComputeClient;

/// Tensors one launch binds beside `fixed` other buffers, at `each` bindings per tensor: at
/// least one.
pub(crate) fn tensors_per_launch<R: CubeRuntime>(
    client: &ComputeClient<R>,
    fixed: usize,
    each: usize,
) -> usize {
    ((client.properties().hardware.max_bindings as usize).saturating_sub(fixed) / each).max(1)
}

/// `items` in order, cut into launches of at most `per_launch` items that share `key` (their
/// dtypes).
pub(crate) fn launches<T, K: PartialEq>(
    items: Vec<T>,
    per_launch: usize,
    key: impl Fn(&T) -> K,
) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    for item in items {
        match out.last_mut() {
            Some(last) if last.len() < per_launch && key(&last[0]) == key(&item) => last.push(item),
            _ => out.push(vec![item]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_hold_at_most_their_share_of_one_key() {
        let items = [1, 1, 1, 2, 2, 1, 1, 1, 1];
        let cut = launches(items.to_vec(), 3, |&i| i);
        assert_eq!(cut, vec![vec![1, 1, 1], vec![2, 2], vec![1, 1, 1], vec![1]]);
        assert!(launches(Vec::<u8>::new(), 3, |&i| i).is_empty());
    }
}
