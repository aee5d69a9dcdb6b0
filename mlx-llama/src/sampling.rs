//! How `generate` picks the next token, with mlx-lm's options and meanings
//! (`mlx_lm.sample_utils`): a repetition penalty over the recent context,
//! then top-k and top-p filters on the log-probabilities, then a draw at a
//! temperature (0: the most likely token).

/// The sampling options of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Temperature: 0 picks the most likely token; finite and not negative.
    pub temperature: f64,
    /// Keep the most likely tokens whose probabilities add up to this
    /// (mlx-lm's `top_p`); 1 (or 0) keeps all.
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Divides the positive logits and multiplies the negative ones of the
    /// tokens in the recent context (mlx-lm's `repetition_penalty`); 1 (or
    /// 0, as mlx-lm) leaves them.
    pub repetition_penalty: f64,
    /// How many of the most recent tokens (prompt included) the penalty
    /// looks at (mlx-lm's `repetition_context_size`, default 20).
    pub repetition_context_size: usize,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::temperature(0.0)
    }
}

impl Sampling {
    /// Plain sampling at `temperature`, no filter, no penalty.
    pub fn temperature(temperature: f64) -> Sampling {
        Sampling {
            temperature,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            repetition_context_size: 20,
        }
    }

    /// Checks the options, naming the one that is out of range.
    pub fn check(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "the temperature must be a finite number of at least 0, got {}",
                self.temperature
            ));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(format!("top-p must be between 0 and 1, got {}", self.top_p));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty < 0.0 {
            return Err(format!(
                "the repetition penalty must be a finite number of at least 0, got {}",
                self.repetition_penalty
            ));
        }
        Ok(())
    }

    /// Whether any option changes the logits before the draw.
    pub(crate) fn filters(&self) -> bool {
        self.penalises() || self.top_k > 0 || (self.top_p > 0.0 && self.top_p < 1.0)
    }

    fn penalises(&self) -> bool {
        self.repetition_penalty != 0.0
            && self.repetition_penalty != 1.0
            && self.repetition_context_size > 0
    }

    /// The scores the draw reads, from the last position's `logits` and
    /// the `history` of tokens so far (prompt and generated): the logits
    /// themselves when no option changes them, else the log-probabilities
    /// after the penalty, with `-inf` for the tokens the filters drop.
    /// mlx-lm's order: the penalty on the logits, the log-softmax, top-k,
    /// then top-p (on the probabilities of the unfiltered distribution, as
    /// mlx-lm's `apply_top_p` reads `exp(logprobs)` after top-k). At
    /// temperature 0 only the penalty applies (mlx-lm's greedy sampler
    /// ignores the filters).
    pub fn scores(&self, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let mut x = logits.to_vec();
        if !self.filters() {
            return x;
        }
        if self.penalises() {
            let start = history.len().saturating_sub(self.repetition_context_size);
            repetition_penalty(&mut x, &history[start..], self.repetition_penalty as f32);
        }
        if self.temperature == 0.0 {
            return x;
        }
        log_softmax(&mut x);
        if self.top_k > 0 && self.top_k < x.len() {
            top_k(&mut x, self.top_k);
        }
        if self.top_p > 0.0 && self.top_p < 1.0 {
            top_p(&mut x, self.top_p);
        }
        x
    }
}

/// mlx-lm's repetition penalty: each distinct token of `recent` has its
/// logit divided by `penalty` when positive (or zero), multiplied when
/// negative. Ids beyond the logits are ignored.
pub fn repetition_penalty(logits: &mut [f32], recent: &[u32], penalty: f32) {
    let mut seen = std::collections::HashSet::new();
    for &t in recent {
        if !seen.insert(t) {
            continue;
        }
        if let Some(l) = logits.get_mut(t as usize) {
            *l = if *l < 0.0 { *l * penalty } else { *l / penalty };
        }
    }
}

/// `x - logsumexp(x)`, in place.
pub fn log_softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return;
    }
    let sum: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    for v in x.iter_mut() {
        *v = (*v as f64 - lse) as f32;
    }
}

/// Keeps the `k` highest scores (ties at the k-th broken by the lower id),
/// setting the rest to `-inf`.
pub fn top_k(x: &mut [f32], k: usize) {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    for &i in &order[k.min(x.len())..] {
        x[i] = f32::NEG_INFINITY;
    }
}

/// mlx-lm's `apply_top_p` on log-probabilities `x`: in ascending order of
/// probability, a token is kept when the cumulative probability up to and
/// including it exceeds `1 - p`; the others become `-inf`.
pub fn top_p(x: &mut [f32], p: f64) {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]).then(b.cmp(&a)));
    let mut cumulative = 0.0f64;
    for &i in &order {
        cumulative += (x[i] as f64).exp();
        if cumulative <= 1.0 - p {
            x[i] = f32::NEG_INFINITY;
        }
    }
}

/// The index of the highest score (the first of equal ones).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(x: &[f32]) -> Vec<usize> {
        (0..x.len()).filter(|&i| x[i].is_finite()).collect()
    }

    #[test]
    fn the_penalty_divides_positive_and_multiplies_negative_logits_of_recent_tokens() {
        let logits = [2.0f32, -2.0, 3.0, -1.0, 4.0];
        let s = Sampling {
            repetition_penalty: 2.0,
            repetition_context_size: 3,
            ..Sampling::temperature(0.0)
        };
        // The context is the last 3 tokens: 1, 0, 0 (token 4 is older);
        // token 0 appears twice and is penalised once.
        let got = s.scores(&logits, &[4, 1, 0, 0]);
        assert_eq!(got, vec![1.0, -4.0, 3.0, -1.0, 4.0]);
        // Greedy picks token 4, which the short context did not penalise,
        // and with the whole history token 2.
        assert_eq!(argmax(&got), 4);
        let all = Sampling {
            repetition_context_size: 20,
            ..s
        };
        assert_eq!(argmax(&all.scores(&logits, &[4, 1, 0, 0])), 2);
    }

    #[test]
    fn top_k_of_one_keeps_only_the_most_likely_token() {
        let logits = [0.5f32, 3.0, -1.0, 2.9, 0.0];
        let s = Sampling {
            top_k: 1,
            ..Sampling::temperature(1.0)
        };
        let x = s.scores(&logits, &[]);
        assert_eq!(kept(&x), vec![1]);
        assert_eq!(argmax(&x), argmax(&logits));
        let s = Sampling { top_k: 3, ..s };
        assert_eq!(kept(&s.scores(&logits, &[])), vec![0, 1, 3]);
    }

    #[test]
    fn top_p_keeps_the_smallest_most_likely_set_reaching_p() {
        // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625.
        let probs = [0.125f64, 0.5, 0.0625, 0.25, 0.0625];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let s = |p| Sampling {
            top_p: p,
            ..Sampling::temperature(1.0)
        };
        // (Cumulative sums from the least likely: 0.0625, 0.125, 0.25, 0.5, 1;
        // a token stays when its sum exceeds 1 - p.)
        assert_eq!(kept(&s(0.45).scores(&logits, &[])), vec![1]);
        assert_eq!(kept(&s(0.55).scores(&logits, &[])), vec![1, 3]);
        assert_eq!(kept(&s(0.7).scores(&logits, &[])), vec![1, 3]);
        assert_eq!(kept(&s(0.8).scores(&logits, &[])), vec![0, 1, 3]);
        assert_eq!(kept(&s(0.9).scores(&logits, &[])).len(), 5 - 1);
        assert_eq!(kept(&s(0.99).scores(&logits, &[])).len(), 5);
        // The kept scores are the unfiltered log-probabilities.
        let x = s(0.55).scores(&logits, &[]);
        assert!((x[1] as f64 - 0.5f64.ln()).abs() < 1e-6, "{x:?}");
    }

    #[test]
    fn bad_options_are_refused_naming_the_option() {
        for t in [-0.1, f64::NAN, f64::INFINITY] {
            let e = Sampling::temperature(t).check().unwrap_err();
            assert!(e.contains("temperature"), "{e}");
        }
        let e = Sampling {
            top_p: 1.5,
            ..Sampling::default()
        }
        .check()
        .unwrap_err();
        assert!(e.contains("top-p"), "{e}");
        assert!(Sampling::temperature(0.8).check().is_ok());
    }
}
