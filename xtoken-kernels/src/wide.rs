//! Host loops compiled for the vector width the CPU has.
//!
//! The crates build for baseline x86-64 (SSE2), so that one binary runs on any x86-64 machine:
//! the compiler vectorizes the host passes four f32 lanes wide. [`wide!`] defines a function
//! whose body is compiled three times, for AVX-512, AVX2 and the baseline, and picks the widest
//! the CPU has at run time (the check is a cached load). Every version runs the same
//! operations in the same order (Rust neither fuses a multiply and an add nor reorders float
//! sums), so all three give the same bits; only the registers are wider.

/// `wide! { fn name(args) -> ret { body } }`: see the module's documentation.
macro_rules! wide {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F, checked on the line above.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, checked on the line above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
