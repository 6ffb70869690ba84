//! The demo's task: questions about a seeded world's facts (48 people's house numbers), whose
//! answers are numerals. Recall is what a tiny model learns in a few hundred steps on two
//! cores; copying or adding the question's numerals needs circuits that take far longer to
//! form (a 3-layer teacher answered 0.7 % of such problems after 600 steps). The evaluation
//! draws fresh questions about the same facts: it measures how well each model learned them.

use std::path::Path;

use anyhow::Result;

/// A problem: its prompt (ending in "A:") and its answer (" 418").
pub type Problem = (String, String);

/// xorshift64*: the corpus generator.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, zero included).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The people of the demo's world.
const NAMES: [&str; 48] = [
    "Ann", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana", "Ivy", "Jon", "Kai", "Lena", "Max",
    "Nora", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Vic", "Wade", "Xena", "Yuri",
    "Zoe", "Abe", "Bea", "Cal", "Dina", "Eli", "Fay", "Gil", "Hugo", "Ida", "Jay", "Kim", "Leo",
    "Mia", "Ned", "Olga", "Paul", "Rita", "Seth", "Tess", "Ugo", "Vera", "Will",
];

/// The facts of a seed's world: each person's house number (1–999; most are numerals the
/// student's tokenizer keeps in one token and the digit-splitting teacher's writes as three).
pub struct World {
    houses: Vec<u64>,
}

impl World {
    pub fn new(rng: &mut Rng) -> Self {
        let houses = NAMES.iter().map(|_| 1 + rng.below(999)).collect();
        Self { houses }
    }

    /// A question about one person's house number, in one of two phrasings.
    pub fn problem(&self, rng: &mut Rng) -> Problem {
        let person = rng.below(NAMES.len() as u64) as usize;
        let name = NAMES[person];
        let question = if rng.below(2) == 0 {
            format!("What is the house number of {name}?")
        } else {
            format!("{name} lives in which house?")
        };
        (
            format!("Q: {question} A:"),
            format!(" {}", self.houses[person]),
        )
    }
}

/// The corpus of `seed`: `train` problems written to `data` as JSON lines (their texts are
/// returned, for the tokenizers) and `held_out` others.
pub fn write(
    seed: u64,
    train: usize,
    held_out: usize,
    data: &Path,
) -> Result<(Vec<String>, Vec<Problem>)> {
    let mut rng = Rng::new(seed);
    let world = World::new(&mut rng);
    let train_set: Vec<Problem> = (0..train).map(|_| world.problem(&mut rng)).collect();
    let held_out = (0..held_out).map(|_| world.problem(&mut rng)).collect();
    let texts: Vec<String> = train_set.iter().map(|(q, a)| format!("{q}{a}\n")).collect();
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    std::fs::write(data, lines.join("\n") + "\n")?;
    Ok((texts, held_out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn every_question_about_a_person_has_that_persons_number() {
        let mut rng = Rng::new(7);
        let world = World::new(&mut rng);
        let mut answers: HashMap<String, String> = HashMap::new();
        for _ in 0..2000 {
            let (prompt, answer) = world.problem(&mut rng);
            assert!(
                prompt.starts_with("Q: ") && prompt.ends_with(" A:"),
                "{prompt}"
            );
            let n: u64 = answer.trim_start().parse().unwrap();
            assert!((1..=999).contains(&n) && answer == format!(" {n}"));
            let name = NAMES
                .iter()
                .find(|&&name| {
                    prompt.contains(&format!(" {name} ")) || prompt.contains(&format!(" {name}?"))
                })
                .unwrap();
            let known = answers
                .entry(name.to_string())
                .or_insert_with(|| answer.clone());
            assert_eq!(*known, answer, "{prompt}");
        }
        assert_eq!(answers.len(), NAMES.len(), "every person is asked about");
        // Seeded: the same seed, the same world.
        let again = World::new(&mut Rng::new(7));
        assert_eq!(again.houses, world.houses);
    }
}
