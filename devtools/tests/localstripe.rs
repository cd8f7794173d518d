//! localstripe found where pip installed it: named by its `localstripe` executable
//! in a virtual environment with no `python` beside it, the bench's `LOCALSTRIPE`
//! case, it starts with the interpreter the executable's first line names. Needs
//! localstripe for some Python on this machine, as the Stripe adapter's tests do.

use std::path::PathBuf;

use payment_worker_devtools::{has_localstripe, LocalStripe, PythonSearch};

#[tokio::test]
async fn starts_with_the_interpreter_named_by_a_localstripe_executable() {
    let virtual_env = std::env::var_os("VIRTUAL_ENV");
    let python = PythonSearch::new(None, virtual_env.as_deref())
        .choose(has_localstripe)
        .expect("localstripe installed for python3 or $VIRTUAL_ENV");
    // The interpreter's own path, as pip writes it (python3 may be a shim).
    let output = std::process::Command::new(&python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let interpreter = PathBuf::from(String::from_utf8(output.stdout).unwrap().trim());
    let venv = std::env::temp_dir().join(format!("venv-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    let executable = venv.join("bin/localstripe");
    std::fs::write(
        &executable,
        format!("#!{}\nimport sys\n", interpreter.display()),
    )
    .unwrap();

    let started = LocalStripe::start_with(Some(&executable)).await;
    let _ = std::fs::remove_dir_all(&venv);
    let localstripe = started.unwrap();
    let balance = reqwest::Client::new()
        .get(format!("{}/v1/balance", localstripe.url()))
        .bearer_auth(payment_worker_devtools::LOCALSTRIPE_KEY)
        .send()
        .await
        .unwrap();
    assert!(balance.status().is_success(), "{}", balance.status());
    localstripe.stop().await;

    // A setting naming nothing that has it is an error naming it, not another Python.
    let missing = venv.join("bin/python");
    let error = LocalStripe::start_with(Some(&missing))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        error.contains(&format!("LOCALSTRIPE={}", missing.display())),
        "{error}"
    );
}
