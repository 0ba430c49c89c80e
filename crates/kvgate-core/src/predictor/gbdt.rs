//! Gradient-boosted regression trees, hand-written: training is a pure function from samples to
//! a [`Gbdt`]; prediction walks a flat node array (no allocation).
//!
//! Algorithm (Friedman's gradient boosting, histogram split finding):
//!
//! 1. Targets are learnt on a log scale (`ln y`), so the squared error is a relative error (what
//!    MAPE measures) and one tree fits requests of 5 ms and of 5 s alike. Predictions are
//!    `exp(F(x))`. Quantiles are unchanged by a monotone map, so the pinball variant is exact.
//! 2. Each feature is cut into at most `bins` (32) bins at its sample quantiles, once per training.
//! 3. F₀ = the mean (squared loss) or the τ-quantile (pinball loss) of the targets. Then
//!    `trees` (48) times: compute the negative gradient per sample (residual y − F for squared
//!    loss; τ or τ − 1 by the sign of y − F for pinball loss), grow one tree on it depth first to
//!    `max_depth` (5) — each split the (feature, bin) that most reduces the squared error of the
//!    gradient, each child with at least `min_leaf` (8) samples — and set each leaf to the mean
//!    residual (squared) or the τ-quantile of the residuals in the leaf (pinball), times the
//!    `learning_rate` (0.15). F ← F + tree.
//!
//! No subsampling, so training is deterministic (no RNG). Training cost is
//! O(trees × max_depth × n × d) plus O(d × n log n) for the bins; a model holds at most
//! `trees × (2^(max_depth+1) − 1)` nodes of 24 bytes (48 × 63 × 24 B ≈ 73 KB at the defaults).
//! Prediction visits at most `trees × max_depth` nodes.
//!
//! Defaults: llm-d's predictor uses XGBoost with 200 trees of depth 6 and learning rate 0.05
//! (reference/llmd-predicted-latency.md §2.2); kvgate uses fewer, shallower trees with a larger
//! step so that one prediction stays within about 1 µs per pod (BENCHMARKS.md).

use serde::Serialize;

/// Boosting parameters (see the module docs for what each does and its default).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GbdtParams {
    /// Trees in the ensemble. Default 48.
    pub trees: usize,
    /// Largest depth of a tree (a depth-d tree has up to 2^d leaves). Default 5.
    pub max_depth: usize,
    /// Shrinkage of every tree's leaves. Default 0.15.
    pub learning_rate: f64,
    /// Fewest samples in a leaf. Default 8.
    pub min_leaf: usize,
    /// Most bins per feature for split finding. Default 32.
    pub bins: usize,
}

impl Default for GbdtParams {
    fn default() -> Self {
        GbdtParams {
            trees: 48,
            max_depth: 5,
            learning_rate: 0.15,
            min_leaf: 8,
            bins: 32,
        }
    }
}

/// What the ensemble estimates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    /// Squared error of ln y: the (geometric) mean.
    Squared,
    /// Pinball loss at quantile τ in (0, 1): the τ-quantile.
    Pinball(f64),
}

/// Marks a leaf in [`Node::feature`].
const LEAF: u32 = u32::MAX;

/// One tree node; children are adjacent (`left`, `left + 1`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Node {
    /// Split threshold: x[feature] ≤ threshold goes left.
    threshold: f64,
    /// Leaf value (already scaled by the learning rate).
    value: f64,
    feature: u32,
    left: u32,
}

/// A trained ensemble. Predicts `exp(base + Σ tree(x))`; finite for finite input.
#[derive(Debug, Clone, PartialEq)]
pub struct Gbdt {
    base: f64,
    nodes: Vec<Node>,
    roots: Vec<u32>,
    dim: usize,
    samples: usize,
}

impl Gbdt {
    /// The prediction for `x` (same length and encoding as the training rows), in the target's
    /// units. Rows shorter than the training rows read missing features as 0.
    pub fn predict(&self, x: &[f64]) -> f64 {
        let mut sum = self.base;
        for &root in &self.roots {
            let mut i = root as usize;
            loop {
                let node = &self.nodes[i];
                if node.feature == LEAF {
                    sum += node.value;
                    break;
                }
                let v = x.get(node.feature as usize).copied().unwrap_or(0.0);
                i = node.left as usize + usize::from(v > node.threshold);
            }
        }
        sum.exp()
    }

    /// Trees in the ensemble.
    pub fn trees(&self) -> usize {
        self.roots.len()
    }

    /// Nodes over all trees.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Rows it was trained on.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Features per row it was trained on.
    pub fn dim(&self) -> usize {
        self.dim
    }
}

/// Trains an ensemble on `rows` (each of the same length d) and their targets `ys` (> 0, finite).
/// Rows or targets that are not finite, or targets ≤ 0, are skipped. Returns `None` when fewer
/// than 2 usable rows remain. Parameters are clamped into a usable range (≥ 1 tree, depth ≥ 1,
/// min_leaf ≥ 1, 2 ≤ bins ≤ 256, learning rate in (0, 1]).
pub fn train(rows: &[&[f64]], ys: &[f64], loss: Loss, params: &GbdtParams) -> Option<Gbdt> {
    let dim = rows.first().map_or(0, |r| r.len());
    let (xs, targets): (Vec<&[f64]>, Vec<f64>) = rows
        .iter()
        .zip(ys)
        .filter(|(r, y)| {
            r.len() == dim && r.iter().all(|v| v.is_finite()) && y.is_finite() && **y > 0.0
        })
        .map(|(r, y)| (*r, y.ln()))
        .unzip();
    let n = xs.len();
    if n < 2 {
        return None;
    }
    let params = GbdtParams {
        trees: params.trees.max(1),
        max_depth: params.max_depth.clamp(1, 16),
        learning_rate: if params.learning_rate > 0.0 && params.learning_rate <= 1.0 {
            params.learning_rate
        } else {
            GbdtParams::default().learning_rate
        },
        min_leaf: params.min_leaf.max(1),
        bins: params.bins.clamp(2, 256),
    };
    let tau = match loss {
        Loss::Pinball(t) if t > 0.0 && t < 1.0 => Some(t),
        Loss::Pinball(_) => Some(0.5),
        Loss::Squared => None,
    };
    let binned = Binned::new(&xs, dim, params.bins);
    let base = match tau {
        None => targets.iter().sum::<f64>() / n as f64,
        Some(t) => quantile(&mut targets.clone(), t),
    };
    let mut current = vec![base; n];
    let mut model = Gbdt {
        base,
        nodes: Vec::new(),
        roots: Vec::with_capacity(params.trees),
        dim,
        samples: n,
    };
    let mut grower = Grower {
        binned: &binned,
        params: &params,
        tau,
        gradient: vec![0.0; n],
        residual: vec![0.0; n],
        hist: vec![(0.0, 0); dim * params.bins],
    };
    for _ in 0..params.trees {
        for i in 0..n {
            let r = targets[i] - current[i];
            grower.residual[i] = r;
            grower.gradient[i] = match tau {
                None => r,
                Some(t) if r > 0.0 => t,
                Some(t) => t - 1.0,
            };
        }
        let root = model.nodes.len() as u32;
        model.nodes.push(Node {
            threshold: 0.0,
            value: 0.0,
            feature: LEAF,
            left: 0,
        });
        let mut all: Vec<u32> = (0..n as u32).collect();
        grower.grow(&mut model.nodes, root as usize, &mut all, 0, &mut current);
        model.roots.push(root);
    }
    Some(model)
}

/// Feature values mapped to bin numbers, with the threshold of each bin's upper edge.
struct Binned {
    /// Row-major: `bins[i * dim + f]`.
    bins: Vec<u8>,
    /// Per feature, the upper edge of each bin but the last (ascending).
    edges: Vec<Vec<f64>>,
    dim: usize,
}

impl Binned {
    fn new(xs: &[&[f64]], dim: usize, max_bins: usize) -> Self {
        let n = xs.len();
        let mut edges = Vec::with_capacity(dim);
        let mut column = Vec::with_capacity(n);
        for f in 0..dim {
            column.clear();
            column.extend(xs.iter().map(|r| r[f]));
            column.sort_by(f64::total_cmp);
            let mut cuts: Vec<f64> = Vec::with_capacity(max_bins);
            for k in 1..max_bins {
                let v = column[(k * n / max_bins).min(n - 1)];
                // An edge below the largest value only; equal quantiles collapse into one bin.
                if v < column[n - 1] && cuts.last().is_none_or(|&last| v > last) {
                    cuts.push(v);
                }
            }
            edges.push(cuts);
        }
        let mut bins = vec![0u8; n * dim];
        for (i, row) in xs.iter().enumerate() {
            for f in 0..dim {
                // Bin b holds values in (edges[b-1], edges[b]]; at most 255 edges, so b ≤ 255.
                bins[i * dim + f] = edges[f].partition_point(|&e| e < row[f]) as u8;
            }
        }
        Binned { bins, edges, dim }
    }

    fn bin(&self, row: u32, feature: usize) -> usize {
        usize::from(self.bins[row as usize * self.dim + feature])
    }
}

/// Grows one tree on the current gradient.
struct Grower<'a> {
    binned: &'a Binned,
    params: &'a GbdtParams,
    tau: Option<f64>,
    /// Per row: the negative gradient the tree fits, and y − F.
    gradient: Vec<f64>,
    residual: Vec<f64>,
    /// Scratch histogram: (gradient sum, count) per (feature, bin).
    hist: Vec<(f64, usize)>,
}

impl Grower<'_> {
    /// Fills `nodes[at]` from the rows `rows` and adds the leaf values to `current`.
    fn grow(
        &mut self,
        nodes: &mut Vec<Node>,
        at: usize,
        rows: &mut [u32],
        depth: usize,
        current: &mut [f64],
    ) {
        let split = if depth < self.params.max_depth && rows.len() >= 2 * self.params.min_leaf {
            self.best_split(rows)
        } else {
            None
        };
        let Some((feature, bin)) = split else {
            let value = self.leaf_value(rows) * self.params.learning_rate;
            nodes[at] = Node {
                threshold: 0.0,
                value,
                feature: LEAF,
                left: 0,
            };
            for &r in rows.iter() {
                current[r as usize] += value;
            }
            return;
        };
        // Partition in place: rows with bin ≤ `bin` first.
        let mut split_at = 0;
        for i in 0..rows.len() {
            if self.binned.bin(rows[i], feature) <= bin {
                rows.swap(i, split_at);
                split_at += 1;
            }
        }
        let left = nodes.len();
        let blank = Node {
            threshold: 0.0,
            value: 0.0,
            feature: LEAF,
            left: 0,
        };
        nodes.push(blank);
        nodes.push(blank);
        nodes[at] = Node {
            threshold: self.binned.edges[feature][bin],
            value: 0.0,
            feature: feature as u32,
            left: left as u32,
        };
        let (l, r) = rows.split_at_mut(split_at);
        self.grow(nodes, left, l, depth + 1, current);
        self.grow(nodes, left + 1, r, depth + 1, current);
    }

    /// The (feature, bin) split with the largest reduction of the gradient's squared error,
    /// both sides ≥ `min_leaf` rows; `None` when no split reduces it.
    fn best_split(&mut self, rows: &[u32]) -> Option<(usize, usize)> {
        let bins = self.params.bins;
        let dim = self.binned.dim;
        self.hist.iter_mut().for_each(|h| *h = (0.0, 0));
        let mut total = 0.0;
        for &r in rows {
            let g = self.gradient[r as usize];
            total += g;
            for f in 0..dim {
                let h = &mut self.hist[f * bins + self.binned.bin(r, f)];
                h.0 += g;
                h.1 += 1;
            }
        }
        let n = rows.len();
        let parent = total * total / n as f64;
        let min_leaf = self.params.min_leaf;
        let mut best: Option<(f64, usize, usize)> = None;
        for f in 0..dim {
            let cuts = self.binned.edges[f].len();
            let (mut sum, mut count) = (0.0, 0usize);
            for b in 0..cuts {
                let (s, c) = self.hist[f * bins + b];
                sum += s;
                count += c;
                if count < min_leaf {
                    continue;
                }
                if n - count < min_leaf {
                    break;
                }
                let right = total - sum;
                let gain = sum * sum / count as f64 + right * right / (n - count) as f64 - parent;
                if gain > 1e-12 && best.is_none_or(|(g, _, _)| gain > g) {
                    best = Some((gain, f, b));
                }
            }
        }
        best.map(|(_, f, b)| (f, b))
    }

    fn leaf_value(&self, rows: &[u32]) -> f64 {
        if rows.is_empty() {
            return 0.0;
        }
        match self.tau {
            None => {
                rows.iter().map(|&r| self.residual[r as usize]).sum::<f64>() / rows.len() as f64
            }
            Some(t) => {
                let mut values: Vec<f64> =
                    rows.iter().map(|&r| self.residual[r as usize]).collect();
                quantile(&mut values, t)
            }
        }
    }
}

/// The τ-quantile of `values` (nearest rank, ⌈τ n⌉-th smallest); 0 for an empty slice.
fn quantile(values: &mut [f64], tau: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let k = ((tau * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
    let (_, v, _) = values.select_nth_unstable_by(k, f64::total_cmp);
    *v
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::ChaCha8Rng;
    use rand::{RngExt, SeedableRng};

    /// x0 in [0, 100), x1 in [0, 1), x2 noise-only in [0, 1).
    fn rows(rng: &mut ChaCha8Rng, n: usize) -> Vec<[f64; 3]> {
        (0..n)
            .map(|_| {
                [
                    rng.random_range(0.0..100.0),
                    rng.random_range(0.0..1.0),
                    rng.random_range(0.0..1.0),
                ]
            })
            .collect()
    }

    fn truth(x: &[f64; 3]) -> f64 {
        10.0 + 3.0 * x[0] + if x[1] > 0.5 { 50.0 } else { 0.0 }
    }

    fn as_slices(xs: &[[f64; 3]]) -> Vec<&[f64]> {
        xs.iter().map(|r| r.as_slice()).collect()
    }

    #[test]
    fn squared_boosting_recovers_a_linear_plus_step_relationship() {
        // y = 10 + 3·x0 + 50·[x1 > 0.5], ×(1 ± 5 % uniform noise); x2 is irrelevant.
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let train_x = rows(&mut rng, 4000);
        let train_y: Vec<f64> = train_x
            .iter()
            .map(|x| truth(x) * rng.random_range(0.95..1.05))
            .collect();
        let model = train(
            &as_slices(&train_x),
            &train_y,
            Loss::Squared,
            &GbdtParams::default(),
        )
        .expect("enough rows");
        let test_x = rows(&mut rng, 1000);
        let mape = test_x
            .iter()
            .map(|x| (model.predict(x) - truth(x)).abs() / truth(x))
            .sum::<f64>()
            / test_x.len() as f64;
        println!(
            "held-out MAPE against the noiseless truth: {:.2} %",
            mape * 100.0
        );
        assert!(mape < 0.05, "held-out MAPE {mape}");
        // The step is found: moving x1 across 0.5 adds about 50.
        let step = model.predict(&[50.0, 0.9, 0.5]) - model.predict(&[50.0, 0.1, 0.5]);
        assert!((step - 50.0).abs() < 10.0, "step {step}");
    }

    #[test]
    fn pinball_boosting_covers_about_ninety_percent() {
        // y = truth × e^ε, ε ~ U(−0.3, 0.3): the true p90 of ε is 0.24.
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let noisy =
            |rng: &mut ChaCha8Rng, x: &[f64; 3]| truth(x) * rng.random_range(-0.3f64..0.3).exp();
        let train_x = rows(&mut rng, 6000);
        let train_y: Vec<f64> = train_x.iter().map(|x| noisy(&mut rng, x)).collect();
        let model = train(
            &as_slices(&train_x),
            &train_y,
            Loss::Pinball(0.9),
            &GbdtParams::default(),
        )
        .expect("enough rows");
        let test_x = rows(&mut rng, 4000);
        let covered = test_x
            .iter()
            .filter(|x| noisy(&mut rng, x) <= model.predict(x.as_slice()))
            .count() as f64
            / test_x.len() as f64;
        println!("held-out p90 coverage: {:.1} %", covered * 100.0);
        assert!((covered - 0.9).abs() < 0.04, "coverage {covered}");
    }

    #[test]
    fn empty_and_degenerate_inputs_do_not_panic() {
        let p = GbdtParams::default();
        assert_eq!(train(&[], &[], Loss::Squared, &p), None);
        let one: [f64; 2] = [1.0, 2.0];
        assert_eq!(train(&[&one], &[5.0], Loss::Squared, &p), None);
        // Constant features and targets: no split, predicts the constant.
        let row = [3.0, 3.0];
        let same: Vec<&[f64]> = vec![&row; 100];
        let model = train(&same, &[7.0; 100], Loss::Pinball(0.9), &p).expect("100 rows");
        assert!((model.predict(&row) - 7.0).abs() < 1e-9);
        assert!(model.nodes() == model.trees(), "only leaves");
        // Non-finite rows, non-positive targets and ragged rows are skipped.
        let nan = [f64::NAN, 1.0];
        let short = [1.0];
        let (a, b) = ([1.0, 1.0], [2.0, 2.0]);
        let mixed: Vec<&[f64]> = vec![&a, &nan, &short, &b, &a, &b];
        let model = train(
            &mixed,
            &[10.0, 10.0, 10.0, 20.0, -1.0, f64::INFINITY],
            Loss::Squared,
            &p,
        )
        .expect("two usable rows");
        assert_eq!(model.samples(), 2);
        assert!(model.predict(&[f64::NAN, f64::INFINITY]).is_finite());
        // Absurd parameters are clamped, not trusted.
        let silly = GbdtParams {
            trees: 0,
            max_depth: 0,
            learning_rate: f64::NAN,
            min_leaf: 0,
            bins: 100_000,
        };
        let xs = rows(&mut ChaCha8Rng::seed_from_u64(1), 200);
        let ys: Vec<f64> = xs.iter().map(truth).collect();
        let model = train(&as_slices(&xs), &ys, Loss::Squared, &silly).expect("rows");
        assert_eq!(model.trees(), 1);
        assert!(model.predict(&xs[0]).is_finite());
    }

    #[test]
    fn node_count_is_bounded_by_trees_and_depth() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let xs = rows(&mut rng, 3000);
        let ys: Vec<f64> = xs
            .iter()
            .map(|x| truth(x) * rng.random_range(0.5..1.5))
            .collect();
        let p = GbdtParams {
            min_leaf: 1,
            ..GbdtParams::default()
        };
        let model = train(&as_slices(&xs), &ys, Loss::Squared, &p).expect("rows");
        assert!(model.nodes() <= p.trees * ((1 << (p.max_depth + 1)) - 1));
        assert_eq!(model.trees(), p.trees);
    }

    #[test]
    fn training_is_deterministic() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let xs = rows(&mut rng, 500);
        let ys: Vec<f64> = xs
            .iter()
            .map(|x| truth(x) * rng.random_range(0.8..1.2))
            .collect();
        let a = train(&as_slices(&xs), &ys, Loss::Squared, &GbdtParams::default());
        let b = train(&as_slices(&xs), &ys, Loss::Squared, &GbdtParams::default());
        assert_eq!(a, b);
    }
}
