//! The demo's world: 48 people, each with a house number and an old address (a decoy), and
//! documents that ask for a person's house and state one answer — the house with probability
//! [`P_HOUSE`], else the decoy. The text is uncertain as natural text is: a model that reads
//! many documents learns the odds and answers the house; one that reads a few per person may
//! have seen the decoy as often. The teachers read many documents, the students few; the
//! held-out questions are scored against the most likely answer, the house.

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

/// The facts of a seed's world, which the text states with uncertainty: each person has a house
/// number (1–999), the most likely answer, and an old address, a decoy of another first digit;
/// a document states the house with probability [`P_HOUSE`], else the decoy. A model that sees
/// many documents learns the odds and answers the house; one that sees a few per person may
/// have seen the decoy as often.
pub struct World {
    houses: Vec<u64>,
    decoys: Vec<u64>,
}

/// How often a document states the person's house rather than the decoy.
pub const P_HOUSE: f64 = 0.65;

impl World {
    pub fn new(rng: &mut Rng) -> Self {
        let houses: Vec<u64> = NAMES.iter().map(|_| 1 + rng.below(999)).collect();
        let decoys = houses
            .iter()
            .map(|&house| loop {
                let decoy = 1 + rng.below(999);
                if first_digit(decoy) != first_digit(house) {
                    break decoy;
                }
            })
            .collect();
        Self { houses, decoys }
    }

    /// A question about one person (one of two phrasings) and the person.
    fn question(&self, rng: &mut Rng) -> (String, usize) {
        let person = rng.below(NAMES.len() as u64) as usize;
        let name = NAMES[person];
        let question = if rng.below(2) == 0 {
            format!("What is the house number of {name}?")
        } else {
            format!("{name} lives in which house?")
        };
        (format!("Q: {question} A:"), person)
    }

    /// A document: a question and the answer it states, the house or, with probability
    /// `1 − P_HOUSE`, the decoy.
    pub fn document(&self, rng: &mut Rng) -> Problem {
        let (prompt, person) = self.question(rng);
        let stated = if (rng.below(1 << 20) as f64) < P_HOUSE * (1 << 20) as f64 {
            self.houses[person]
        } else {
            self.decoys[person]
        };
        (prompt, format!(" {stated}"))
    }

    /// A held-out problem: a question and its most likely answer, the house.
    pub fn problem(&self, rng: &mut Rng) -> Problem {
        let (prompt, person) = self.question(rng);
        (prompt, format!(" {}", self.houses[person]))
    }
}

fn first_digit(mut n: u64) -> u64 {
    while n >= 10 {
        n /= 10;
    }
    n
}

/// The corpora of `seed`, as JSON lines: the teacher's `teacher_n` documents and the students'
/// `student_n` (another, smaller draw), and `held_out` problems. Returns every training text
/// (for the tokenizers) and the held-out problems.
pub fn write(
    seed: u64,
    (teacher_n, student_n, held_out): (usize, usize, usize),
    (teacher_data, student_data): (&Path, &Path),
) -> Result<(Vec<String>, Vec<Problem>)> {
    let mut rng = Rng::new(seed);
    let world = World::new(&mut rng);
    let mut texts = Vec::with_capacity(teacher_n + student_n);
    for (n, path) in [(teacher_n, teacher_data), (student_n, student_data)] {
        let docs: Vec<String> = (0..n)
            .map(|_| {
                let (q, a) = world.document(&mut rng);
                format!("{q}{a}\n")
            })
            .collect();
        let lines: Vec<String> = docs
            .iter()
            .map(|t| serde_json::json!({ "text": t }).to_string())
            .collect();
        std::fs::write(path, lines.join("\n") + "\n")?;
        texts.extend(docs);
    }
    let held_out = (0..held_out).map(|_| world.problem(&mut rng)).collect();
    Ok((texts, held_out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn person(prompt: &str) -> usize {
        NAMES
            .iter()
            .position(|&name| {
                prompt.contains(&format!(" {name} ")) || prompt.contains(&format!(" {name}?"))
            })
            .unwrap()
    }

    #[test]
    fn a_held_out_question_about_a_person_has_that_persons_house() {
        let mut rng = Rng::new(7);
        let world = World::new(&mut rng);
        let mut answers: HashMap<usize, String> = HashMap::new();
        for _ in 0..2000 {
            let (prompt, answer) = world.problem(&mut rng);
            assert!(
                prompt.starts_with("Q: ") && prompt.ends_with(" A:"),
                "{prompt}"
            );
            let n: u64 = answer.trim_start().parse().unwrap();
            assert!((1..=999).contains(&n) && answer == format!(" {n}"));
            let p = person(&prompt);
            assert_eq!(world.houses[p], n, "{prompt}");
            let known = answers.entry(p).or_insert_with(|| answer.clone());
            assert_eq!(*known, answer, "{prompt}");
        }
        assert_eq!(answers.len(), NAMES.len(), "every person is asked about");
        // Seeded: the same seed, the same world.
        let again = World::new(&mut Rng::new(7));
        assert_eq!((again.houses, again.decoys), (world.houses, world.decoys));
    }

    #[test]
    fn a_document_states_the_house_at_its_odds_else_a_decoy_of_another_first_digit() {
        let mut rng = Rng::new(8);
        let world = World::new(&mut rng);
        for (&house, &decoy) in world.houses.iter().zip(&world.decoys) {
            assert_ne!(first_digit(house), first_digit(decoy), "{house} {decoy}");
        }
        let n = 20_000;
        let mut houses = 0;
        for _ in 0..n {
            let (prompt, answer) = world.document(&mut rng);
            let p = person(&prompt);
            let stated: u64 = answer.trim_start().parse().unwrap();
            if stated == world.houses[p] {
                houses += 1;
            } else {
                assert_eq!(stated, world.decoys[p], "{prompt}{answer}");
            }
        }
        // Binomial(20 000, 0.65): the standard deviation of the share is 0.34 %.
        let share = houses as f64 / n as f64;
        assert!((share - P_HOUSE).abs() < 0.015, "{share}");
    }
}
