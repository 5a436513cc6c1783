//! The ranks of a world as a grid with named axes (`dp × pp × tp`), like torchtitan's
//! `ParallelDims` and PyTorch's `DeviceMesh`.
//!
//! Ranks are laid out row-major: the last axis varies fastest, so with `dp × pp = 2 × 2`
//! ranks 0 and 1 are the two pipeline stages of data-parallel replica 0. Every axis splits the
//! world into groups of the ranks that share all other coordinates: along `pp` those are the
//! stages of one replica, along `dp` the copies of one stage. A flat world is the one-axis
//! mesh `dp = world_size`.

use std::fmt;

/// A mesh that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// No axis at all.
    #[error("a mesh needs at least one axis, e.g. dp = world size")]
    NoAxes,
    /// An axis of degree 0.
    #[error("mesh axis {axis} has degree 0; every axis needs at least 1 rank")]
    ZeroDegree {
        /// The axis.
        axis: String,
    },
    /// Two axes with one name, or an empty name.
    #[error("mesh axis name {axis:?} is empty or used twice; give every axis its own name")]
    BadName {
        /// The name.
        axis: String,
    },
    /// The degrees do not multiply to the world size.
    #[error(
        "mesh {mesh} has {size} ranks but the world has {world_size}; the degrees must \
         multiply to the world size"
    )]
    Size {
        /// The mesh, as `dp=2 × pp=3`.
        mesh: String,
        /// The product of its degrees.
        size: usize,
        /// The world size.
        world_size: usize,
    },
    /// An axis the mesh does not have.
    #[error("mesh {mesh} has no axis {axis:?}")]
    UnknownAxis {
        /// The mesh.
        mesh: String,
        /// The axis asked for.
        axis: String,
    },
}

/// One named axis of a [`Mesh`] and its degree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Axis {
    /// The axis's name: `dp`, `pp`, `tp`, ….
    pub name: String,
    /// Ranks along it.
    pub degree: usize,
}

/// The ranks of a world arranged along named axes. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mesh {
    axes: Vec<Axis>,
}

impl Mesh {
    /// The data-parallel axis of every strategy that replicates.
    pub const DP: &'static str = "dp";
    /// The pipeline axis.
    pub const PP: &'static str = "pp";
    /// The tensor-parallel axis.
    pub const TP: &'static str = "tp";

    /// A mesh of the given `(name, degree)` axes, outermost first.
    ///
    /// # Errors
    /// [`MeshError`] for no axes, a zero degree, or an empty or repeated name.
    pub fn new(axes: &[(&str, usize)]) -> Result<Self, MeshError> {
        if axes.is_empty() {
            return Err(MeshError::NoAxes);
        }
        for (i, (name, degree)) in axes.iter().enumerate() {
            if name.is_empty() || axes[..i].iter().any(|(other, _)| other == name) {
                return Err(MeshError::BadName {
                    axis: name.to_string(),
                });
            }
            if *degree == 0 {
                return Err(MeshError::ZeroDegree {
                    axis: name.to_string(),
                });
            }
        }
        Ok(Self {
            axes: axes
                .iter()
                .map(|(name, degree)| Axis {
                    name: name.to_string(),
                    degree: *degree,
                })
                .collect(),
        })
    }

    /// The one-axis mesh `dp = world_size`.
    ///
    /// # Panics
    /// When `world_size` is 0.
    pub fn flat(world_size: usize) -> Self {
        Self::new(&[(Self::DP, world_size)]).expect("a flat world has at least one rank")
    }

    /// Checks that the mesh covers exactly `world_size` ranks.
    ///
    /// # Errors
    /// [`MeshError::Size`].
    pub fn check_size(&self, world_size: usize) -> Result<(), MeshError> {
        if self.size() == world_size {
            Ok(())
        } else {
            Err(MeshError::Size {
                mesh: self.to_string(),
                size: self.size(),
                world_size,
            })
        }
    }

    /// The axes, outermost first.
    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    /// Ranks in the mesh: the product of the degrees.
    pub fn size(&self) -> usize {
        self.axes.iter().map(|a| a.degree).product()
    }

    /// The degree of `axis`, 1 when the mesh does not have it (a missing axis is not split).
    pub fn degree(&self, axis: &str) -> usize {
        self.position(axis).map_or(1, |i| self.axes[i].degree)
    }

    fn position(&self, axis: &str) -> Option<usize> {
        self.axes.iter().position(|a| a.name == axis)
    }

    fn require(&self, axis: &str) -> Result<usize, MeshError> {
        self.position(axis).ok_or_else(|| MeshError::UnknownAxis {
            mesh: self.to_string(),
            axis: axis.to_string(),
        })
    }

    /// `rank`'s coordinate along each axis, outermost first.
    ///
    /// # Panics
    /// When `rank` is not below [`Mesh::size`].
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        assert!(rank < self.size(), "rank {rank} outside mesh {self}");
        let mut rest = rank;
        let mut coords = vec![0; self.axes.len()];
        for (i, axis) in self.axes.iter().enumerate().rev() {
            coords[i] = rest % axis.degree;
            rest /= axis.degree;
        }
        coords
    }

    /// The rank at `coords` (outermost first).
    ///
    /// # Panics
    /// When `coords` has the wrong length or a coordinate outside its axis.
    pub fn rank(&self, coords: &[usize]) -> usize {
        assert_eq!(coords.len(), self.axes.len(), "one coordinate per axis");
        coords.iter().zip(&self.axes).fold(0, |rank, (c, axis)| {
            assert!(
                *c < axis.degree,
                "coordinate {c} outside axis {}",
                axis.name
            );
            rank * axis.degree + c
        })
    }

    /// `rank`'s coordinate along `axis` (0 when the mesh does not have the axis).
    pub fn coord(&self, rank: usize, axis: &str) -> usize {
        self.position(axis).map_or(0, |i| self.coords(rank)[i])
    }

    /// The rank at the given coordinates of named axes and 0 on every other axis; an axis
    /// the mesh lacks counts as an axis of degree 1 (its only coordinate is 0).
    ///
    /// # Panics
    /// When a coordinate is not below its axis's degree (a non-zero coordinate on an axis the
    /// mesh lacks included).
    pub fn rank_at(&self, coords: &[(&str, usize)]) -> usize {
        for &(name, c) in coords {
            assert!(
                c == 0 || self.axes.iter().any(|axis| axis.name == name),
                "coordinate {c} on axis {name}, which mesh {self} lacks"
            );
        }
        let full: Vec<usize> = self
            .axes
            .iter()
            .map(|axis| {
                coords
                    .iter()
                    .find(|(name, _)| *name == axis.name)
                    .map_or(0, |&(_, c)| c)
            })
            .collect();
        self.rank(&full)
    }

    /// The ranks that share every coordinate of `rank` but `axis`'s, in order along `axis`:
    /// `rank`'s group along that axis.
    ///
    /// # Errors
    /// [`MeshError::UnknownAxis`].
    pub fn group_of(&self, axis: &str, rank: usize) -> Result<Vec<usize>, MeshError> {
        let i = self.require(axis)?;
        let mut coords = self.coords(rank);
        Ok((0..self.axes[i].degree)
            .map(|c| {
                coords[i] = c;
                self.rank(&coords)
            })
            .collect())
    }

    /// Every group along `axis` (they partition the ranks), each in order along the axis,
    /// ordered by their first rank.
    ///
    /// # Errors
    /// [`MeshError::UnknownAxis`].
    pub fn groups(&self, axis: &str) -> Result<Vec<Vec<usize>>, MeshError> {
        let i = self.require(axis)?;
        Ok((0..self.size())
            .filter(|&rank| self.coords(rank)[i] == 0)
            .map(|rank| self.group_of(axis, rank).expect("the axis exists"))
            .collect())
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, axis) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(" × ")?;
            }
            write!(f, "{}={}", axis.name, axis.degree)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_row_major_and_coordinates_invert_them() {
        let mesh = Mesh::new(&[("dp", 2), ("pp", 3)]).unwrap();
        assert_eq!(mesh.size(), 6);
        assert_eq!(mesh.coords(4), vec![1, 1]);
        for rank in 0..6 {
            assert_eq!(mesh.rank(&mesh.coords(rank)), rank);
        }
        assert_eq!(mesh.coord(5, "pp"), 2);
        assert_eq!(mesh.coord(5, "tp"), 0);
        assert_eq!(mesh.degree("tp"), 1);
        assert_eq!(mesh.to_string(), "dp=2 × pp=3");
    }

    #[test]
    fn groups_along_an_axis_partition_the_ranks() {
        let mesh = Mesh::new(&[("dp", 2), ("pp", 3)]).unwrap();
        assert_eq!(
            mesh.groups("pp").unwrap(),
            vec![vec![0, 1, 2], vec![3, 4, 5]]
        );
        assert_eq!(
            mesh.groups("dp").unwrap(),
            vec![vec![0, 3], vec![1, 4], vec![2, 5]]
        );
        assert_eq!(mesh.group_of("dp", 4).unwrap(), vec![1, 4]);
        assert_eq!(Mesh::flat(3).groups("dp").unwrap(), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn bad_meshes_are_clear_errors() {
        assert_eq!(Mesh::new(&[]), Err(MeshError::NoAxes));
        assert_eq!(
            Mesh::new(&[("dp", 2), ("pp", 0)]).unwrap_err().to_string(),
            "mesh axis pp has degree 0; every axis needs at least 1 rank"
        );
        assert!(matches!(
            Mesh::new(&[("dp", 2), ("dp", 2)]),
            Err(MeshError::BadName { .. })
        ));
        assert_eq!(
            Mesh::new(&[("dp", 2), ("pp", 2)])
                .unwrap()
                .check_size(6)
                .unwrap_err()
                .to_string(),
            "mesh dp=2 × pp=2 has 4 ranks but the world has 6; the degrees must multiply to \
             the world size"
        );
        assert!(matches!(
            Mesh::flat(2).groups("tp"),
            Err(MeshError::UnknownAxis { .. })
        ));
    }
}
