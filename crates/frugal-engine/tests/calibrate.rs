//! The kernel and prefetch chosen at start by measurement ([`Model::calibrate`]): each start
//! runs in a process of its own, as the choice is once per process.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stdout)]

use std::path::Path;
use std::process::Command;

use frugal_engine::model::{Calibrate, LoadOptions, Model};
use frugal_engine::quant::{Kernel, Prefetch};

/// What one start in a child process chose: kernel and source.
fn start(cache_home: &Path, env: &[(&str, &str)]) -> (Kernel, String) {
    let (kernel, _, source) = start_with_prefetch(cache_home, env);
    (kernel, source)
}

/// What one start in a child process chose: kernel, prefetch and source.
fn start_with_prefetch(cache_home: &Path, env: &[(&str, &str)]) -> (Kernel, Prefetch, String) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "calibrate_in_this_process", "--nocapture"])
        .args(["--test-threads=1"])
        .env("FRUGAL_TEST_CALIBRATE", "1")
        .env("XDG_CACHE_HOME", cache_home)
        .env_remove("FRUGAL_ISA")
        .env_remove("FRUGAL_PREFETCH")
        .env_remove("FRUGAL_CALIBRATE");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("chose ").map(|(_, v)| v))
        .unwrap_or_else(|| panic!("no choice in {stdout}"));
    let [kernel, prefetch, source] = line.split(' ').collect::<Vec<_>>()[..] else {
        panic!("{line}");
    };
    (
        Kernel::from_name(kernel).unwrap(),
        Prefetch::from_name(prefetch).unwrap(),
        source.to_owned(),
    )
}

fn cache_file(cache_home: &Path) -> std::path::PathBuf {
    cache_home.join("frugal/kernels.json")
}

/// The child of the tests below: does nothing unless they start it.
#[test]
fn calibrate_in_this_process() {
    if std::env::var_os("FRUGAL_TEST_CALIBRATE").is_none() {
        return;
    }
    Kernel::select_from_env().unwrap();
    Prefetch::set_from_env().unwrap();
    let path = frugal_testkit::test_model(frugal_engine::DEFAULT_MODEL);
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let c = model.calibrate(&Calibrate::from_env());
    // The choice is the kernel and prefetch the process runs.
    assert_eq!(Kernel::active(), c.kernel);
    assert_eq!(Prefetch::active(), c.prefetch);
    assert!(c.kernel.is_available());
    assert!(c.threads >= 1);
    println!("{c}");
    println!("chose {} {} {}", c.kernel, c.prefetch, c.source.name());
}

fn simd() -> bool {
    Kernel::Avx512Vnni.is_available() || Kernel::Avx2.is_available()
}

/// A first start measures and caches its choice (a kernel the CPU has and a prefetch, timed
/// with the others); the next takes it from the cache; `FRUGAL_CALIBRATE=1` measures again,
/// `FRUGAL_CALIBRATE=0` takes the widest kernel unmeasured.
#[test]
fn the_choice_is_measured_once_then_read_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let many = simd();
    let (first, source) = start(dir.path(), &[]);
    if !many {
        // One kernel to run: nothing to measure or cache.
        assert_eq!(source, "flags");
        assert!(!cache_file(dir.path()).exists());
        return;
    }
    assert_eq!(source, "measured");
    assert_ne!(first, Kernel::Scalar);
    let text = std::fs::read_to_string(cache_file(dir.path())).unwrap();
    assert!(text.contains(&format!("\"kernel\": \"{first}\"")), "{text}");
    assert_eq!(start(dir.path(), &[]), (first, "cached".to_owned()));
    let (_, source) = start(dir.path(), &[("FRUGAL_CALIBRATE", "1")]);
    assert_eq!(source, "measured");
    assert_eq!(
        start(dir.path(), &[("FRUGAL_CALIBRATE", "0")]),
        (Kernel::best(), "flags".to_owned())
    );
}

/// A cache file that is broken, or holds only another machine's choice, is passed over:
/// the start measures and writes a good one.
#[test]
fn a_broken_or_foreign_cache_is_measured_over() {
    if !simd() {
        return; // The scalar kernel alone: nothing is measured.
    }
    let dir = tempfile::tempdir().unwrap();
    let file = cache_file(dir.path());
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let foreign = r#"{"version": 2, "entries": {"AuthenticAMD Other CPU (64 cores); 64 threads; avx2/l1 avx2/l2; Q4_0:960x576": {"kernel": "avx2", "prefetch": "l2", "timings": []}}}"#;
    for text in ["\u{0}garbage{", foreign] {
        std::fs::write(&file, text).unwrap();
        let (kernel, source) = start(dir.path(), &[]);
        assert_eq!(source, "measured", "{text}");
        assert_ne!(kernel, Kernel::Scalar);
        assert_eq!(start(dir.path(), &[]).1, "cached", "{text}");
    }
    // The foreign entry is kept beside this machine's.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("Other CPU"), "{text}");
}

/// `FRUGAL_ISA` fixes the kernel and `FRUGAL_PREFETCH` the prefetch: only what is left is
/// measured (a SIMD kernel's prefetch), and with both fixed nothing is measured or cached.
#[test]
fn frugal_prefetch_fixes_the_prefetch() {
    let Some(kernel) = [Kernel::Avx2, Kernel::Avx512Vnni]
        .into_iter()
        .find(|k| k.is_available())
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (k, _, source) = start_with_prefetch(dir.path(), &[("FRUGAL_ISA", kernel.name())]);
    assert_eq!((k, source.as_str()), (kernel, "measured"));
    std::fs::remove_file(cache_file(dir.path())).unwrap();
    let both = [("FRUGAL_ISA", kernel.name()), ("FRUGAL_PREFETCH", "l2")];
    assert_eq!(
        start_with_prefetch(dir.path(), &both),
        (kernel, Prefetch::L2, "fixed".to_owned())
    );
    assert!(!cache_file(dir.path()).exists());
    // Without FRUGAL_ISA the kernels are measured with the prefetch it names.
    let (_, prefetch, source) = start_with_prefetch(dir.path(), &[("FRUGAL_PREFETCH", "L1")]);
    assert_eq!(prefetch, Prefetch::L1);
    assert_ne!(source, "fixed");
}

/// `FRUGAL_ISA=scalar` fixes the kernel, which has no prefetch: nothing is measured or
/// cached, even with a cache that chose another.
#[test]
fn frugal_isa_overrides_the_calibration() {
    let dir = tempfile::tempdir().unwrap();
    let isa = [("FRUGAL_ISA", "scalar")];
    assert_eq!(
        start(dir.path(), &isa),
        (Kernel::Scalar, "fixed".to_owned())
    );
    assert!(!cache_file(dir.path()).exists());
    let (chosen, _) = start(dir.path(), &[]);
    if chosen != Kernel::Scalar {
        assert_eq!(
            start(dir.path(), &isa),
            (Kernel::Scalar, "fixed".to_owned())
        );
    }
}
