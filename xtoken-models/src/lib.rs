//! Llama-3, Qwen3 and Phi-3/Phi-4-mini as burn modules, loaded from Hugging Face `config.json`
//! and safetensors checkpoints, behind one `CausalLm` trait (issue 5).
