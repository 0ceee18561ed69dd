//! Chi-square tests: sticky chains sample providers in proportion to their weights
//! (DESIGN §4.3). Keys are fixed strings, so the statistics are deterministic and cannot flake;
//! the thresholds are the χ² critical values at p = 0.001.

use switchyard_core::chain::sticky_chain;

const NAMES: [&str; 5] = ["anthropic", "vertex", "bedrock", "openai", "azure"];
const WEIGHTS: [f64; 5] = [0.5, 0.3, 0.15, 0.05, 0.0];
const KEYS: usize = 100_000;

fn chi_square(observed: &[u64], expected: &[f64]) -> f64 {
    observed
        .iter()
        .zip(expected)
        .map(|(&o, &e)| (o as f64 - e).powi(2) / e)
        .sum()
}

fn chains() -> impl Iterator<Item = Vec<usize>> {
    (0..KEYS).map(|i| sticky_chain(&format!("project-{i}"), &NAMES, &WEIGHTS))
}

#[test]
fn first_choice_frequencies_match_weights_chi_square() {
    let mut first = [0u64; 5];
    for chain in chains() {
        first[chain[0]] += 1;
    }
    // The zero-weight provider is never first (and is always last).
    assert_eq!(first[4], 0);
    let expected: Vec<f64> = WEIGHTS[..4].iter().map(|w| w * KEYS as f64).collect();
    let stat = chi_square(&first[..4], &expected);
    eprintln!("first choice {first:?}, chi-square {stat:.3} (df 3)");
    // 4 categories → 3 degrees of freedom; χ²(0.999, 3) = 16.266.
    assert!(stat < 16.266, "chi-square {stat:.2} for {first:?}");
}

#[test]
fn first_two_positions_follow_sampling_without_replacement() {
    // P(first = i, second = j) = wi · wj / (1 − wi) for weighted sampling without replacement.
    let mut pairs = [[0u64; 4]; 4];
    for chain in chains() {
        assert_eq!(chain[4], 4);
        pairs[chain[0]][chain[1]] += 1;
    }
    let (mut observed, mut expected) = (Vec::new(), Vec::new());
    for i in 0..4 {
        for j in 0..4 {
            if i != j {
                observed.push(pairs[i][j]);
                expected.push(KEYS as f64 * WEIGHTS[i] * WEIGHTS[j] / (1.0 - WEIGHTS[i]));
            }
        }
    }
    let stat = chi_square(&observed, &expected);
    eprintln!("first two positions: chi-square {stat:.3} (df 11)");
    // 12 categories → 11 degrees of freedom; χ²(0.999, 11) = 31.264.
    assert!(stat < 31.264, "chi-square {stat:.2}");
}
