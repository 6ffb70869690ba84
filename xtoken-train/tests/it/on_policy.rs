//! On-policy distillation (`[on_policy]`): the student writes, the teachers grade.

use crate::fixture::*;
use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Distribution, Tensor};
use xtoken_core::align::{AlignParams, Workspace};
use xtoken_core::loss::{ce, evaluate, Loss, LossParams, TeacherTargets};
use xtoken_core::plan::MergeVariant;
use xtoken_train::data::written::{on_policy_batch, written};
use xtoken_train::data::Pipeline;

type B = Autodiff<NdArray>;

/// The student's text after a prompt keeps its chunks in the generated span only, cut back to
/// whole characters, with no cross-entropy label: the gradient of the logit rows that predict
/// prompt tokens is exactly zero, and the rows that predict written tokens get one.
#[test]
fn only_the_generated_span_is_trained() {
    let f = fixture("on-policy-span");
    let pipeline = Pipeline::load(
        &f.student,
        std::slice::from_ref(&f.teacher),
        AlignParams::default(),
    )
    .unwrap();
    let s = &pipeline.student;
    let prompt = s.encode("Ann has 12 apples").unwrap();
    let mut continuation = s.encode_pieces(&[" and gets 34 more."]).unwrap().remove(0);
    // The first two bytes of "€" (E2 82 AC): a character the student did not finish.
    continuation.extend([0xE2u32, 0x82]);
    let ws = &mut Workspace::default();
    let row = written(&pipeline, ws, &prompt, &continuation).unwrap();
    assert_eq!(row.text, "Ann has 12 apples and gets 34 more.");
    assert_eq!(row.prompt_len, prompt.len());
    assert_eq!(row.generated, continuation.len() - 2);
    // The teacher read the same text: its ids spell it.
    let t = &pipeline.teachers[0];
    assert_eq!(row.row.teachers[0].0, t.encode(&row.text).unwrap());

    let rows = vec![row.clone(), row];
    let micro = on_policy_batch(rows, MergeVariant::FirstToken, 1).unwrap();
    assert!(micro.on_policy);
    let plan = &micro.teachers[0].plan;
    assert!(plan.student.next_token.iter().all(|&t| t == -1));
    assert!(plan.valid_chunks() > 0);

    let device = Default::default();
    let (rows, len, vs) = (micro.rows, micro.student_len, s.size());
    let logits = Tensor::<B, 3>::random([rows, len, vs], Distribution::Normal(0.0, 1.0), &device)
        .require_grad();
    let teacher = Tensor::<NdArray, 3>::random(
        [rows, micro.teachers[0].len, t.size()],
        Distribution::Normal(0.0, 2.0),
        &device,
    );
    let params = LossParams::default();
    let targets = TeacherTargets::new(Tensor::from_inner(teacher), plan, &params).unwrap();
    let kd = evaluate(logits.clone(), &targets, Loss::uld(), &params).unwrap();
    let cross_entropy = ce::loss(logits.clone(), &plan.student.next_token, &params).unwrap();
    assert_eq!(cross_entropy.clone().into_scalar(), 0.0);
    let grads = (kd + cross_entropy).backward();
    let grad = logits.grad(&grads).unwrap();
    let norms: Vec<f32> = (grad.clone() * grad)
        .sum_dim(2)
        .into_data()
        .convert::<f32>()
        .to_vec()
        .unwrap();
    for b in 0..rows {
        let row = &norms[b * len..(b + 1) * len];
        // Row j predicts token j + 1: rows before `prompt_len - 1` predict prompt tokens.
        assert!(
            row[..prompt.len() - 1].iter().all(|&n| n == 0.0),
            "a prompt row has a gradient: {row:?}"
        );
        assert!(
            row[prompt.len() - 1..].iter().any(|&n| n > 0.0),
            "no generated row has a gradient: {row:?}"
        );
    }
}

/// `[on_policy]` with λ = 0 is today's run: the same losses, the same weights.
#[test]
fn lambda_zero_is_the_off_policy_run() {
    let f = fixture("on-policy-zero");
    let steps = |text: &str| text.replace("steps = 6", "steps = 3");
    let plain = config(&f, "plain", "");
    std::fs::write(&plain, steps(&std::fs::read_to_string(&plain).unwrap())).unwrap();
    let zero = config(
        &f,
        "zero",
        "[on_policy]\nfraction = 0.0\nprompt_tokens = 6\nmax_new_tokens = 8\n",
    );
    std::fs::write(&zero, steps(&std::fs::read_to_string(&zero).unwrap())).unwrap();
    ok(train(&plain, &[]));
    ok(train(&zero, &[]));
    let names = ["loss", "ce", "kd", "loss_digits", "loss_same", "grad_norm"];
    assert_eq!(
        columns(&f.dir.0.join("plain"), &names),
        columns(&f.dir.0.join("zero"), &names)
    );
    let weights = |run: &str| std::fs::read(f.dir.0.join(run).join("student/model.safetensors"));
    assert_eq!(weights("plain").unwrap(), weights("zero").unwrap());
}

/// λ = 1: every sequence is written by the student; the step has no cross-entropy, its KD is
/// finite, and the metrics say what was written. `--check` prints the plan.
#[test]
fn lambda_one_trains_on_what_the_student_writes() {
    let f = fixture("on-policy-one");
    let on_policy = "[on_policy]\nfraction = 1.0\nprompt_tokens = 8\nmax_new_tokens = 12\n";
    let path = config(&f, "one", &format!("{on_policy}temperature = 0.7\n"));
    let plan = xtoken(&["train", "--config", path.to_str().unwrap(), "--check"]);
    let plan = String::from_utf8_lossy(&plan.stdout).into_owned();
    assert!(
        plan.contains("on-policy: λ = 1: about 4 of 4 sequences per step written by the student")
            && plan.contains("first 8 student tokens; up to 12 new tokens at temperature 0.7"),
        "{plan}"
    );
    let log = ok(train(&path, &[]));
    eprintln!("{log}");
    let run = f.dir.0.join("one");
    let rows = columns(
        &run,
        &[
            "ce",
            "kd",
            "on_policy_share",
            "generated_tokens",
            "generation_tokens_per_s",
        ],
    );
    assert_eq!(rows.len(), 6);
    for r in &rows {
        assert_eq!(r[0], 0.0, "no cross-entropy on written text: {r:?}");
        assert!(r[1].is_finite() && r[1] != 0.0, "{r:?}");
        assert_eq!(r[2], 1.0);
        assert!(r[3] > 0.0 && r[3] <= 12.0 && r[4] > 0.0, "{r:?}");
    }
}

/// λ = 0.5 draws some sequences of each step on-policy (micro-batches of one kind each); a run
/// stopped, killed while saving and resumed writes the same sequences and ends bit-identical.
#[test]
fn a_resumed_on_policy_run_ends_bit_identical() {
    let f = fixture("on-policy-resume");
    let extra = "[on_policy]\nfraction = 0.5\nprompt_tokens = 8\nmax_new_tokens = 12\n";
    let log = ok(train(&config(&f, "straight", extra), &[]));
    eprintln!("{log}");
    let shares = columns(&f.dir.0.join("straight"), &["on_policy_share", "ce"]);
    assert!(
        shares.iter().any(|r| r[0] > 0.0 && r[0] < 1.0),
        "some step mixes both kinds: {shares:?}"
    );
    resumes_exactly(&f, "straight", "interrupted", extra);
}

/// Settings a run cannot use are refused naming the key, before anything loads.
#[test]
fn bad_on_policy_settings_are_named() {
    let f = fixture("on-policy-bad");
    let fits = "prompt_tokens = 8\nmax_new_tokens = 8";
    let cases = [
        (format!("fraction = 1.5\n{fits}"), "on_policy.fraction = 1.5: must be a fraction in [0, 1]"),
        (
            "fraction = 0.5\nprompt_tokens = 16\nmax_new_tokens = 16".into(),
            "on_policy.prompt_tokens + on_policy.max_new_tokens = 32: more than training.context_length = 24",
        ),
        (format!("fraction = 0.5\n{fits}\ntop_p = 0.0"), "on_policy.top_p = 0: must be in (0, 1]"),
        (format!("fraction = 0.5\n{fits}\ntemperature = -1.0"), "on_policy.temperature = -1: must be ≥ 0"),
        ("fraction = 0.5\nprompt_tokens = 8\nmax_new_tokens = 0".into(), "on_policy.max_new_tokens = 0: must be at least 1"),
        ("frac = 0.5".into(), "unknown field `frac`"),
    ];
    for (i, (section, message)) in cases.into_iter().enumerate() {
        let path = config(&f, &format!("bad{i}"), &format!("[on_policy]\n{section}\n"));
        let out = train(&path, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(message),
            "{section}: {err}"
        );
    }
    let cached = config(
        &f,
        "cached",
        "[on_policy]\nfraction = 0.5\nprompt_field = \"prompt\"\nmax_new_tokens = 8\n",
    );
    let text = std::fs::read_to_string(&cached)
        .unwrap()
        .replace("[data]\n", "[data]\ncache = true\n");
    std::fs::write(&cached, text).unwrap();
    let err = String::from_utf8_lossy(&train(&cached, &[]).stderr).into_owned();
    assert!(
        err.contains("on_policy.prompt_field: an alignment cache"),
        "{err}"
    );
}

/// Prompts from a field: records that hold only a prompt serve the on-policy sequences, records
/// that hold only text the packed rows.
#[test]
fn prompts_come_from_a_field() {
    let f = fixture("on-policy-field");
    let lines: Vec<String> = problems(40)
        .iter()
        .enumerate()
        .map(|(i, text)| match i % 2 {
            0 => serde_json::json!({ "text": text }).to_string(),
            _ => serde_json::json!({ "prompt": &text[..12] }).to_string(),
        })
        .collect();
    std::fs::write(&f.data, lines.join("\n") + "\n").unwrap();
    let path = config(
        &f,
        "field",
        "[on_policy]\nfraction = 0.5\nprompt_field = \"prompt\"\nmax_new_tokens = 8\n",
    );
    ok(train(&path, &[]));
    let rows = columns(
        &f.dir.0.join("field"),
        &["on_policy_share", "ce", "generated_tokens"],
    );
    assert!(rows.iter().any(|r| r[0] > 0.0 && r[1] > 0.0), "{rows:?}");
    // Without the field configured, a record without text is an error naming it.
    let plain = config(&f, "plain", "");
    let err = String::from_utf8_lossy(&train(&plain, &[]).stderr).into_owned();
    // (The first such record the seeded order reaches.)
    assert!(
        err.contains("train.jsonl:") && err.contains(": no field `text`"),
        "{err}"
    );
}
