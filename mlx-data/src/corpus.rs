//! The built-in offline corpus: short children's stories from a small deterministic grammar.
//!
//! It lets the whole pipeline run with no network. The same parameters always give
//! byte-identical text, so token stores built from it are reproducible.

use crate::rng::SplitMix64;
use crate::split::Split;

/// Parameters of the generated corpus.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OfflineCorpus {
    /// Seed of the story grammar.
    pub seed: u64,
    /// Approximate size of the training split in bytes.
    pub train_bytes: usize,
    /// Approximate size of the validation split in bytes.
    pub validation_bytes: usize,
}

impl Default for OfflineCorpus {
    fn default() -> Self {
        OfflineCorpus {
            seed: 42,
            train_bytes: 6 << 20,
            validation_bytes: 300 << 10,
        }
    }
}

/// Version of the grammar; part of the source identity so old stores are rebuilt.
pub const GRAMMAR_VERSION: u32 = 1;

const NAMES: &[&str] = &[
    "Lily", "Tom", "Mia", "Ben", "Sue", "Max", "Anna", "Sam", "Lucy", "Tim", "Zoe", "Jack", "Ella",
    "Leo", "Rosie", "Finn", "Kim", "Bob", "Daisy", "Noah",
];
const ANIMALS: &[&str] = &[
    "cat", "dog", "bunny", "bird", "frog", "fox", "bear", "duck", "mouse", "owl", "lion", "turtle",
    "puppy", "kitten", "squirrel", "fish",
];
const ADJECTIVES: &[&str] = &[
    "little", "big", "happy", "shy", "brave", "silly", "kind", "curious", "sleepy", "tiny",
    "friendly", "grumpy", "clever", "gentle", "funny", "bright",
];
const COLORS: &[&str] = &[
    "red", "blue", "green", "yellow", "purple", "pink", "orange", "shiny", "golden", "white",
];
const OBJECTS: &[&str] = &[
    "ball", "kite", "hat", "box", "book", "cake", "flower", "stone", "shell", "toy car", "balloon",
    "cup", "blanket", "key", "drum", "boat",
];
const PLACES: &[&str] = &[
    "park", "garden", "forest", "house", "school", "beach", "farm", "hill", "lake", "town", "yard",
    "meadow",
];
const FEELINGS: &[&str] = &[
    "happy",
    "sad",
    "scared",
    "excited",
    "angry",
    "surprised",
    "proud",
    "worried",
    "calm",
];
const ACTIONS: &[&str] = &[
    "play", "run", "jump", "dance", "sing", "swim", "read", "paint", "climb", "hide",
];
const PROBLEMS: &[&str] = &[
    "the {obj} was stuck in a tall tree",
    "the {obj} fell into the water",
    "a strong wind took the {obj} away",
    "the {obj} was broken in two",
    "a big dog ran off with the {obj}",
    "the {obj} was lost under the leaves",
];
const FIXES: &[&str] = &[
    "{friend} helped {name} get it back",
    "{name} asked Mom for help, and Mom fixed it",
    "{name} tried again and again until it worked",
    "{friend} had a good idea, and they did it together",
    "{name} shared a snack with {friend}, and {friend} helped",
];
const MORALS: &[&str] = &[
    "{name} learned that it is good to share.",
    "{name} learned that friends help each other.",
    "{name} learned to be patient and to never give up.",
    "{name} learned that being kind makes everyone happy.",
    "From that day on, {name} and {friend} were best friends.",
    "{name} smiled and went home for dinner.",
];

/// Generates one story with `rng`.
pub fn story(rng: &mut SplitMix64) -> String {
    let name = *rng.pick(NAMES);
    let mut friend = *rng.pick(NAMES);
    if friend == name {
        friend = NAMES[(NAMES.iter().position(|n| *n == name).unwrap_or(0) + 1) % NAMES.len()];
    }
    let animal = *rng.pick(ANIMALS);
    let adj = *rng.pick(ADJECTIVES);
    let color = *rng.pick(COLORS);
    let obj = *rng.pick(OBJECTS);
    let place = *rng.pick(PLACES);
    let fill = |t: &&str| {
        t.replace("{name}", name)
            .replace("{friend}", friend)
            .replace("{obj}", obj)
    };
    let mut s = String::with_capacity(600);
    match rng.below(3) {
        0 => s.push_str(&format!(
            "Once upon a time, there was a {adj} {animal} named {name}. {name} lived near a big {place}."
        )),
        1 => s.push_str(&format!(
            "One day, a {adj} girl named {name} went to the {place} with her {animal}."
        )),
        _ => s.push_str(&format!(
            "{name} was a {adj} boy who loved to {} in the {place}.",
            rng.pick(ACTIONS)
        )),
    }
    s.push_str(&format!(
        " {name} had a {color} {obj}. {name} loved the {obj} very much."
    ));
    for _ in 0..rng.below(3) {
        let act = rng.pick(ACTIONS);
        let feel = rng.pick(FEELINGS);
        s.push_str(&format!(
            " Every day, {name} liked to {act} with {friend}. It made {name} feel {feel}."
        ));
    }
    s.push_str(&format!(" But one day, {}.", fill(rng.pick(PROBLEMS))));
    s.push_str(&format!(
        " {name} felt {}. \"Oh no!\" said {name}.",
        rng.pick(FEELINGS)
    ));
    s.push_str(&format!(" Then {}.", fill(rng.pick(FIXES))));
    if rng.below(2) == 0 {
        s.push_str(&format!(
            " \"Thank you, {friend}!\" said {name}. {friend} said, \"You are welcome!\""
        ));
    }
    s.push(' ');
    s.push_str(&fill(rng.pick(MORALS)));
    s
}

/// Generates stories until about `bytes` bytes of text, starting from `seed`.
pub fn stories(seed: u64, bytes: usize) -> Vec<String> {
    let mut rng = SplitMix64::new(seed);
    let mut out = Vec::new();
    let mut total = 0;
    while total < bytes {
        let s = story(&mut rng);
        total += s.len() + 1;
        out.push(s);
    }
    out
}

impl OfflineCorpus {
    /// The stories of one split (`validation` uses a different seed stream).
    pub fn split(&self, split: Split) -> Vec<String> {
        match split {
            Split::Train => stories(self.seed, self.train_bytes),
            Split::Validation => stories(
                crate::rng::mix(self.seed ^ 0x5641_4C49_4441_5445),
                self.validation_bytes,
            ),
        }
    }

    /// A stable identity of this corpus, recorded in token store headers.
    pub fn identity(&self, split: Split) -> String {
        format!(
            "offline:v{GRAMMAR_VERSION}:seed={}:train={}:validation={}:{}",
            self.seed,
            self.train_bytes,
            self.validation_bytes,
            split.name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_sized() {
        let a = stories(1, 100_000);
        let b = stories(1, 100_000);
        assert_eq!(a, b);
        let total: usize = a.iter().map(|s| s.len() + 1).sum();
        assert!((100_000..101_000).contains(&total), "{total}");
        assert_ne!(a, stories(2, 100_000));
        assert!(a.iter().all(|s| !s.is_empty() && !s.contains("{")));
    }

    #[test]
    fn splits_differ() {
        let c = OfflineCorpus {
            seed: 3,
            train_bytes: 20_000,
            validation_bytes: 5_000,
        };
        let t = c.split(Split::Train);
        let v = c.split(Split::Validation);
        assert_ne!(t[0], v[0]);
    }
}
