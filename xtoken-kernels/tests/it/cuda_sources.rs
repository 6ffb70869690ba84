//! The CUDA sources of the kernels, written without a GPU (`cuda_sources`): every cubecl
//! kernel the crate defines is launched by the workload in each dtype, its source is CUDA C++
//! with the entry point NVRTC compiles, and the workload's calls are valid on a backend that
//! computes (the recording one computes nothing, so it would not notice a bad call).

use std::collections::BTreeSet;
use std::path::Path;

use burn::tensor::DType;
use xtoken_kernels::cuda_sources::{emit, record, workload, Recorded, ARCHS, MANIFEST_HEADER};

/// The kernels `src/cube` defines: each function under `#[cube(launch_unchecked …)]`.
fn defined_kernels() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut pending = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cube")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let mut lines = text.lines();
            while let Some(line) = lines.next() {
                if !line.starts_with("#[cube(launch") {
                    continue;
                }
                let signature = lines.find(|l| l.contains("fn ")).unwrap();
                let name = signature.split("fn ").nth(1).unwrap();
                found.insert(name.split(['<', '(']).next().unwrap().to_string());
            }
        }
    }
    found
}

/// `row_lse` for `RowLse`: cubecl names a kernel's type after its function in CamelCase.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

fn ours(recorded: &[Recorded]) -> Vec<&Recorded> {
    recorded.iter().filter(|k| k.origin() == "xtoken").collect()
}

#[test]
fn every_kernel_is_written_as_cuda_in_every_dtype() {
    let recorded = record(90).unwrap();
    let defined = defined_kernels();
    assert!(defined.len() >= 25, "{defined:?}");
    for dtype in ["f32", "bf16", "f16"] {
        let launched: BTreeSet<String> = ours(&recorded)
            .iter()
            .filter(|k| k.context.starts_with(&format!("{dtype}: ")))
            .map(|k| snake(k.short_name()))
            .collect();
        // A kernel launched first in another dtype may not be compiled again in this one
        // (one without a float type); every kernel is launched in f32.
        if dtype == "f32" {
            let missing: Vec<_> = defined.difference(&launched).collect();
            assert!(
                missing.is_empty(),
                "not launched by the workload: {missing:?}"
            );
        }
        assert!(
            launched.len() >= 15,
            "{dtype}: only {launched:?} compiled for it"
        );
    }
    for k in ours(&recorded) {
        let source = k.source.as_ref().unwrap();
        // `extern "C" __global__ void __launch_bounds__(256)row_lse_f_f32 (`
        let entry = source
            .lines()
            .find(|l| l.starts_with("extern \"C\" __global__ void "))
            .unwrap_or_else(|| panic!("{}: no kernel in\n{source}", k.name));
        assert!(
            entry.contains(&format!("{} (", k.entrypoint)),
            "{}: the entry point is not {}: {entry}",
            k.name,
            k.entrypoint
        );
        assert_eq!(k.arch, 90);
        assert!(k.threads() > 0 && k.threads() <= 1024, "{}", k.name);
    }
    // The 16-bit kernels are CUDA's own types.
    let bf16 = ours(&recorded)
        .into_iter()
        .find(|k| k.context.starts_with("bf16: ") && k.short_name() == "RowLse")
        .expect("row_lse in bf16");
    assert!(bf16.source.as_ref().unwrap().contains("__nv_bfloat16"));
}

#[test]
fn the_workload_runs_on_a_backend_that_computes() {
    let mut steps = Vec::new();
    let mut label = |s: &str| steps.push(s.to_string());
    workload::run_on::<burn::backend::NdArray>(&Default::default(), DType::F32, &mut label)
        .unwrap();
    workload::run_on::<burn_flex::Flex>(&Default::default(), DType::BF16, &mut label).unwrap();
    assert!(steps.contains(&"bf16: attention forward + backward, head dim 96".to_string()));
    assert!(steps.contains(&"f32: done".to_string()), "{steps:?}");
}

#[test]
fn emit_writes_each_kernel_with_a_manifest_and_refuses_a_used_directory() {
    let dir = std::env::temp_dir().join(format!("xtoken-cuda-sources-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let written = emit(&dir, &ARCHS).unwrap();
    assert!(xtoken_kernels::cuda_sources::is_manifest(
        &dir.join("manifest.tsv")
    ));
    let manifest = std::fs::read_to_string(dir.join("manifest.tsv")).unwrap();
    let mut lines = manifest.lines();
    assert_eq!(lines.next(), Some(MANIFEST_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    let total: usize = written.iter().map(|(_, k)| k.len()).sum();
    assert_eq!(rows.len(), total);
    for row in &rows {
        assert_eq!(row.len(), MANIFEST_HEADER.split('\t').count());
        let file = dir.join(row[1]);
        assert!(file.is_file(), "{}", file.display());
        assert!(row[1].starts_with(&format!("sm_{}-", row[0])));
    }
    for arch in ["90", "80"] {
        assert!(rows.iter().any(|r| r[0] == arch && r[4] == "xtoken"));
    }
    // A directory that holds anything is refused, and left as it was.
    let err = emit(&dir, &ARCHS).unwrap_err().to_string();
    assert!(err.contains("is not empty"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("manifest.tsv")).unwrap(),
        manifest
    );
    std::fs::remove_dir_all(&dir).ok();
}
