//! Layered configuration: defaults, file, environment; validation names the key; secrets hidden.
//! Environment variables are process-wide, so these tests run in one function, in order.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;

use aptix::config::{ConfigError, Settings};

fn write(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn invalid_key(text: &str) -> String {
    match Settings::load(Some(write(text).path())) {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("expected an invalid key, got {other:?}"),
    }
}

#[test]
fn layers_validation_and_redaction() {
    // Built-in defaults alone are valid and carry the documented default context.
    let defaults = Settings::load(None).unwrap();
    assert_eq!(defaults.amqp.prefix, "aptix");
    let ctx = defaults.conversation_context(None).unwrap();
    assert_eq!(ctx.tools.len(), 2);
    assert_eq!(
        ctx.tools[0].parameters["additionalProperties"], false,
        "JSON Schema keys keep their case"
    );

    // A file overrides defaults and adds contexts; ids keep their case.
    let file = write(
        r#"
        default_conversation_context = "DDR"
        [amqp]
        url = "amqp://app:s3cret@mq.internal:5672/%2f"
        [conversation_contexts.DDR]
        mode = "DDR_CREATION"
        mode_display_name = "DDR Creation"
        model = "gpt-5.1"
        system_prompt = "You write DDRs."
        tool_choice = "ddr_document"
        [[conversation_contexts.DDR.tools]]
        name = "ddr_document"
        parameters = '{"type":"object","properties":{}}'
        "#,
    );
    let s = Settings::load(Some(file.path())).unwrap();
    assert_eq!(s.conversation_context(None).unwrap().mode, "DDR_CREATION");
    // The example's `default` context, which this file neither names nor makes the default,
    // is not offered: a client naming it would get a model, tools and budget nobody set.
    let ids: Vec<&str> = s.conversation_contexts.keys().map(String::as_str).collect();
    assert_eq!(ids, ["DDR"]);
    assert!(s.agent_contexts.contains_key("default"), "still the default agent context");
    let printed = format!("{s:?} {}", toml::to_string(&s).unwrap());
    assert!(!printed.contains("s3cret"), "password leaked: {printed}");

    // The environment beats the file.
    std::env::set_var("APTIX__AMQP__PREFIX", "from-env");
    std::env::set_var("APTIX__LIMITS__MAX_ARTIFACTS", "3");
    std::env::set_var("OPENAI_API_KEY", "sk-test-key");
    // The rollout setting of docs/deploy.md, a list, from the environment.
    std::env::set_var("APTIX__AMQP__STAGE_PARTITIONS", "8");
    std::env::set_var("APTIX__AMQP__DRAINING_STAGE_PARTITIONS", "2,4");
    let s = Settings::load(Some(file.path())).unwrap();
    for key in ["PREFIX", "STAGE_PARTITIONS", "DRAINING_STAGE_PARTITIONS"] {
        std::env::remove_var(format!("APTIX__AMQP__{key}"));
    }
    std::env::remove_var("APTIX__LIMITS__MAX_ARTIFACTS");
    assert_eq!(s.amqp.draining_stage_partitions, [2, 4]);
    // One earlier value, as docs/deploy.md sets it (the environment reads it as a number).
    std::env::set_var("APTIX__AMQP__DRAINING_STAGE_PARTITIONS", "4");
    let one = Settings::load(Some(file.path()));
    std::env::remove_var("APTIX__AMQP__DRAINING_STAGE_PARTITIONS");
    assert_eq!(one.expect("one draining value").amqp.draining_stage_partitions, [4]);
    // Spaces after commas, and an empty value (none draining), as an operator may write them.
    for (value, want) in [("2, 4", vec![2, 4]), ("", vec![])] {
        std::env::set_var("APTIX__AMQP__DRAINING_STAGE_PARTITIONS", value);
        let loaded = Settings::load(Some(file.path()));
        std::env::remove_var("APTIX__AMQP__DRAINING_STAGE_PARTITIONS");
        assert_eq!(loaded.expect(value).amqp.draining_stage_partitions, want, "{value:?}");
    }
    assert_eq!(s.amqp.prefix, "from-env");
    assert_eq!(s.limits.max_artifacts, 3);
    // A secret of digits is taken as written: not read as a number first, which would drop its
    // leading zeros (or round a long one as a float).
    let digits = "00123456789012345678901234567890";
    std::env::set_var("APTIX__CONSOLE__ADMIN_TOKEN", digits);
    std::env::set_var("APTIX__PIPELINE__MIGRATE_ON_START", "FALSE");
    let loaded = Settings::load(Some(file.path()));
    std::env::remove_var("APTIX__CONSOLE__ADMIN_TOKEN");
    std::env::remove_var("APTIX__PIPELINE__MIGRATE_ON_START");
    let loaded = loaded.expect("digits and a bool from the environment");
    assert_eq!(loaded.console.admin_token.as_ref().map(|t| t.expose()), Some(digits));
    assert!(!loaded.pipeline.migrate_on_start, "a bool read from its text");
    assert_eq!(s.llm.api_key.as_ref().map(|k| k.expose()), Some("sk-test-key"));
    assert!(!format!("{s:?}").contains("sk-test-key"));
    std::env::remove_var("OPENAI_API_KEY");

    // Every validation error names its key.
    assert_eq!(invalid_key("[amqp]\nurl = \"http://x\""), "amqp.url");
    assert_eq!(invalid_key("[database]\nurl = \"mysql://x\""), "database.url");
    assert_eq!(invalid_key("[pipeline]\nmessage_key = \"short\""), "pipeline.message_key");
    assert_eq!(invalid_key("[pipeline]\nworker_threads = 5000"), "pipeline.worker_threads");
    // A collection's name is a directory of the embedded store's: never a path.
    for name in ["../acme", "./acme", "acme/", "x/../acme", ".", "a\\b", ""] {
        let text = format!("[agent_contexts.x]\ncollection = {name:?}");
        assert_eq!(invalid_key(&text), "agent_contexts.x.collection", "{name:?}");
        // `aptix index --collection` names one too.
        let given = Some(name.to_owned());
        assert!(aptix::cli::index::resolve_collection(&s, given, None).is_err(), "{name:?}");
    }
    // A layout being drained is an earlier one, never the current one (nor 1).
    let draining = "[amqp]\nstage_partitions = 8\ndraining_stage_partitions = [8]";
    assert_eq!(invalid_key(draining), "amqp.draining_stage_partitions");
    assert_eq!(invalid_key("[amqp]\nstage_partitions = 3"), "amqp.stage_partitions");
    assert_eq!(invalid_key("default_agent_context = \"nope\""), "default_agent_context");
    assert_eq!(
        invalid_key("[conversation_contexts.default]\nmode='M'\nmode_display_name='M'\nmodel='m'\nsystem_prompt=''\ntool_choice='missing'"),
        "conversation_contexts.default.tool_choice"
    );
    assert_eq!(
        invalid_key("[conversation_contexts.default]\nmode='M'\nmode_display_name='M'\nmodel='m'\nsystem_prompt=''\ntemperature=3.0"),
        "conversation_contexts.default.temperature"
    );

    assert_eq!(invalid_key("[pipeline]\nconfirm_timeout_ms = 0"), "pipeline.confirm_timeout_ms");
    assert_eq!(invalid_key("[pipeline.prefetch]\ninvoke = 0"), "pipeline.prefetch.invoke");
    assert_eq!(invalid_key("[files]\nretention_hours = 0"), "files.retention_hours");
    assert_eq!(
        invalid_key("[telemetry]\nmetrics_listen = \"localhost:9464\""),
        "telemetry.metrics_listen"
    );
    // Unknown keys are load errors that name the key.
    let err = Settings::load(Some(write("[amqp]\nurll = \"x\"").path())).unwrap_err().to_string();
    assert!(err.contains("urll"), "{err}");

    secrets_anywhere_are_redacted();
}

/// Every secret marked `pw-…`: URL passwords, secret query parameters and API keys in every
/// URL and key setting. None reaches `Debug`, the serialised settings or `aptix config`.
const SECRET_FILE: &str = r#"
    [amqp]
    url = "amqps://app:pw-amqp@mq:5671/%2f?heartbeat=10&Password=pw-amqp-query"
    [database]
    url = "postgres://aptix@db:5432/aptix?password=pw-db&sslmode=require"
    [llm]
    base_url = "https://llm.example/openai/v1?api-version=2024-10&api-key=pw-llm-query"
    api_key = "pw-llm-key"
    [vector]
    url = "https://qdrant:6334/?api_key=pw-vector-query"
    api_key = "pw-vector-key"
    embeddings_url = "https://emb.example/v1?access_token=pw-emb-query"
    embeddings_api_key = "pw-emb-key"
    [telemetry]
    otlp_endpoint = "http://otel:pw-otlp@collector:4318/v1/traces?token=pw-otlp-query"
    [[conversation_contexts.default.server_tools.mcp]]
    name = "tickets"
    url = "https://mcp:pw-mcp@tools.example/mcp?api_key=pw-mcp-query"
    allowed_tools = ["open_ticket"]
    [agent_contexts.tenant]
    collection = "tenant"
    llm_base_url = "https://tenant.example/v1?apikey=pw-tenant-query&sslpassword=pw-ssl"
    llm_api_key = "pw-tenant-key"
"#;

fn secrets_anywhere_are_redacted() {
    let file = write(SECRET_FILE);
    let s = Settings::load(Some(file.path())).unwrap();
    assert_eq!(
        s.database.url.expose(),
        "postgres://aptix@db:5432/aptix?password=pw-db&sslmode=require"
    );
    let printed = format!("{s:?}\n{}", toml::to_string_pretty(&s).unwrap());
    assert!(!printed.contains("pw-"), "a secret leaked:\n{printed}");
    assert!(
        printed.contains("postgres://aptix@db:5432/aptix?password=***&sslmode=require"),
        "{printed}"
    );
    assert!(printed.contains("api-version=2024-10&api-key=***"), "{printed}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aptix"))
        .args(["config", "--config"])
        .arg(file.path())
        .env_remove("APTIX_CONFIG")
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.contains("pw-"), "`aptix config` leaked a secret:\n{stdout}");
    for kept in [
        "amqps://app:***@mq:5671/%2f?heartbeat=10&Password=***",
        "postgres://aptix@db:5432/aptix?password=***&sslmode=require",
        "http://otel:***@collector:4318/v1/traces?token=***",
        "https://tenant.example/v1?apikey=***&sslpassword=***",
        "https://mcp:***@tools.example/mcp?api_key=***",
    ] {
        assert!(stdout.contains(kept), "missing {kept} in\n{stdout}");
    }
}

/// The shipped boot prompt states the five expectations of the reasoner (AGN-002 §9).
#[test]
fn the_default_boot_prompt_states_the_reasoner_expectations() {
    let s = aptix::config::Settings::load(None).unwrap();
    let prompt = s.conversation_contexts["default"].system_prompt.to_lowercase();
    for expectation in [
        "use only the code and content provided in the [context] section",
        "authoritative for its line span",
        "do not merge them unless explicitly asked",
        "prefer incremental updates to full rewrites",
        "reference chunks by id or chunk number",
    ] {
        assert!(prompt.contains(expectation), "missing: {expectation}\n{prompt}");
    }
}

#[test]
fn file_urls_follow_the_listener_unless_a_base_url_is_set() {
    // The defaults alone, without the environment the other test changes.
    let mut s: Settings = toml::from_str(aptix::config::DEFAULTS_TOML).unwrap();
    s.telemetry.metrics_listen = "127.0.0.1:9555".into();
    assert_eq!(s.files_base_url(), "http://127.0.0.1:9555");
    assert!(!s.files_listen_is_wildcard());
    s.telemetry.metrics_listen = "0.0.0.0:9600".into();
    assert_eq!(s.files_base_url(), "http://127.0.0.1:9600");
    assert!(s.files_listen_is_wildcard(), "the workers warn at start");
    s.telemetry.metrics_listen = "[::]:9600".into();
    assert_eq!(s.files_base_url(), "http://[::1]:9600");
    // A listener of their own: the URL follows it, not the metrics one.
    s.files.listen = "10.0.0.5:9470".into();
    assert_eq!(s.files_listen(), "10.0.0.5:9470");
    assert_eq!(s.files_base_url(), "http://10.0.0.5:9470");
    s.files.base_url = Some("https://files.example.com/".into());
    assert_eq!(s.files_base_url(), "https://files.example.com");
    assert!(!s.files_listen_is_wildcard());
}

#[test]
fn a_budget_needs_a_capped_context_and_a_priced_model() {
    let uncapped = "[conversation_contexts.default]\nusd_per_day = 5.0";
    assert_eq!(invalid_key(uncapped), "conversation_contexts.default.max_output_tokens");
    let unpriced = "[conversation_contexts.default]\nusd_per_day = 5.0\nmax_output_tokens = 512\n\
                    model = \"unpriced-model\"";
    assert_eq!(invalid_key(unpriced), "conversation_contexts.default.model");
    // A tenant's budget applies to the contexts it may use.
    let tenant = "[tenants.acme]\nusers = [\"u\"]\nagent_contexts = [\"default\"]\n\
                  conversation_contexts = [\"default\"]\nlimits = { usd_per_month = 100.0 }";
    assert_eq!(invalid_key(tenant), "conversation_contexts.default.max_output_tokens");
    let ok = format!("{tenant}\n[conversation_contexts.default]\nmax_output_tokens = 512");
    let s = Settings::load(Some(write(&ok).path())).unwrap();
    assert!(s.budgets_configured());
    let acme = s.tenant_names().pop().unwrap();
    assert_eq!(s.limits_of(Some(&acme)).budget().per_month.micros(), 100_000_000);
    // Amounts are dollars from 0 up; a negative one is a load error naming the key.
    let err = Settings::load(Some(write("[tenant_limits]\nusd_per_day = -1.0").path()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("usd_per_day") || err.contains("-1"), "{err}");
    let too_small = "[conversation_contexts.default]\nmax_output_tokens = 8";
    assert_eq!(invalid_key(too_small), "conversation_contexts.default.max_output_tokens");
}

/// Runs `command`, killed after 30 s (a worker that ignored its arguments would run on).
fn finished(mut command: std::process::Command) -> std::process::Output {
    let mut child = command
        .env_remove("APTIX_CONFIG")
        .env("APTIX__AMQP__PREFIX", format!("cfg-{}", std::process::id()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..300 {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.kill().unwrap();
    panic!("still running after 30 s: {:?}", child.wait_with_output().unwrap());
}

#[test]
fn worker_binaries_and_aptix_config_check_what_they_are_given() {
    use std::process::Command;
    // `aptix config` refuses what every worker would refuse at start.
    let file = write("[pipeline.prefetch]\ninvok = 8\n");
    let mut config = Command::new(env!("CARGO_BIN_EXE_aptix"));
    config.args(["config", "--config"]).arg(file.path());
    let out = finished(config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invok"), "{stderr}");
    // A worker binary reads the file it is given (a missing one stops it at once, named) and
    // answers --help without starting.
    let mut missing = Command::new(env!("CARGO_BIN_EXE_aptix-validate"));
    missing.args(["--config", "/nonexistent/aptix-prod.toml"]);
    let out = finished(missing);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("aptix-prod.toml"), "{stderr}");
    // With a configuration it starts its stage: it waits for its broker and database (both
    // unreachable here) rather than stopping at once.
    let mut worker = Command::new(env!("CARGO_BIN_EXE_aptix-persist"))
        .env_remove("APTIX_CONFIG")
        .env("APTIX__AMQP__URL", "amqp://guest:guest@127.0.0.1:1/%2f")
        .env("APTIX__DATABASE__URL", "postgres://postgres@127.0.0.1:1/none")
        .env("APTIX__TELEMETRY__METRICS_LISTEN", "")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let exited = worker.try_wait().unwrap();
    worker.kill().unwrap();
    let out = worker.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(exited.is_none(), "aptix-persist stopped at start ({exited:?}): {stderr}");
    let mut help = Command::new(env!("CARGO_BIN_EXE_aptix-invoke"));
    help.arg("--help");
    let out = finished(help);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("--config"), "{stdout}");
    assert!(stdout.contains("aptix-invoke"), "{stdout}");
}

/// A command that cannot reach what it needs exits 3 where 2 means something of its own
/// (`submit`: a timeout; `reprocess`: bad options), and 2 where that is its documented failure.
#[test]
fn a_command_that_cannot_run_is_not_read_as_its_own_exit_two() {
    use std::process::Command;
    let unreachable = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_aptix"));
        command
            .args(args)
            .env("APTIX__AMQP__URL", "amqp://guest:guest@127.0.0.1:1/%2f")
            .env("APTIX__DATABASE__URL", "postgres://postgres@127.0.0.1:1/none");
        let out = finished(command);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let request = write(
        r#"{"SessionId":"5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f","TurnId":"t1","Instruction":"hi"}"#,
    );
    let path = request.path().to_str().unwrap();
    for args in [&["submit", path, "--wait", "--timeout", "5"][..], &["reprocess", "--all"]] {
        let (code, stderr) = unreachable(args);
        assert_eq!(code, Some(3), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
    let (code, stderr) = unreachable(&["status"]);
    assert_eq!(code, Some(2), "status: {stderr}");
    // A mistyped flag is not a timeout either; `reprocess`'s 2 means bad options already.
    let (code, stderr) = unreachable(&["submit", path, "--wiat"]);
    assert_eq!(code, Some(3), "submit --wiat: {stderr}");
    assert!(stderr.contains("--wiat"), "{stderr}");
    let (code, stderr) = unreachable(&["reprocess", "--al"]);
    assert_eq!(code, Some(2), "reprocess --al: {stderr}");
    let (code, _) = unreachable(&["submit", "--help"]);
    assert_eq!(code, Some(0), "help");
}
