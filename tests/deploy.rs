//! The deployment files, checked without Docker, a cluster or a network: `docker-compose.yml`,
//! `deploy/Dockerfile`, `.dockerignore`, `deploy/k8s/` and `deploy/rabbitmq/` (in the `rabbitmq`
//! module).
//!
//! Every YAML document parses; every command names a `[[bin]]` target; every `APTIX__…`
//! variable is a configuration key (proved by `aptix config` with those variables set, which
//! refuses unknown keys, and by finding each value in the effective configuration it prints);
//! health checks and probes use the metrics port and the `/healthz` / `/readyz` paths; the
//! RabbitMQ definitions and the KEDA queue names match `aptix::broker::Topology` (Kubernetes:
//! quorum queues and a partitioned ingress, whose scaler sums every partition); retrieve
//! autoscales only with a Qdrant server; compose pins the Qdrant server the client crate speaks
//! to; the broker's users, permissions, policies, plugins and message size limit are the ones
//! every shipped configuration wires.

// Helpers panic with the file and key at fault; unwrap is the point in a test.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use aptix::broker::{StageName, Topology, RETRY_TIERS_MS};
use aptix::config::QueueType;
use serde_yaml_ng::Value as Yaml;

// The RabbitMQ checks, in their own file (a subdirectory: not a test target of its own).
#[path = "deploy/rabbitmq.rs"]
mod rabbitmq;

// --- helpers -------------------------------------------------------------------------------

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// Every document of a YAML stream, with `<<` merge keys resolved (repeatedly, since a merged
/// mapping may carry merge keys of its own, as compose's `x-worker` does).
fn yaml_docs(rel: &str) -> Vec<Yaml> {
    let text = read(rel);
    let mut docs = Vec::new();
    for de in serde_yaml_ng::Deserializer::from_str(&text) {
        let mut doc: Yaml =
            serde::Deserialize::deserialize(de).unwrap_or_else(|e| panic!("{rel}: {e}"));
        for _ in 0..8 {
            doc.apply_merge().unwrap_or_else(|e| panic!("{rel}: merge keys: {e}"));
        }
        assert!(!has_merge_key(&doc), "{rel}: unresolved `<<` merge key");
        if !doc.is_null() {
            docs.push(doc);
        }
    }
    docs
}

fn has_merge_key(v: &Yaml) -> bool {
    match v {
        Yaml::Mapping(m) => m.contains_key("<<") || m.values().any(has_merge_key),
        Yaml::Sequence(s) => s.iter().any(has_merge_key),
        Yaml::Tagged(t) => has_merge_key(&t.value),
        _ => false,
    }
}

fn yaml_str<'a>(v: &'a Yaml, what: &str) -> &'a str {
    v.as_str().unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

/// A scalar as the string a process would see in its environment.
fn scalar(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::Null => String::new(),
        other => panic!("not a scalar: {other:?}"),
    }
}

fn string_list(v: &Yaml, what: &str) -> Vec<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("{what} is not a list: {v:?}"))
        .iter()
        .map(|s| yaml_str(s, what).to_owned())
        .collect()
}

/// Compose-style interpolation as if no variable were set: `${X:-d}` and `${X-d}` become `d`,
/// `${X}` becomes empty, `$$` is a literal `$`.
fn interpolate(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').unwrap_or_else(|| panic!("unclosed ${{ in {s:?}"));
            let expr = &body[..end];
            if let Some((_, default)) = expr.split_once(":-").or_else(|| expr.split_once('-')) {
                out.push_str(default);
            }
            rest = &body[end + 1..];
        } else {
            panic!("bare $ in {s:?}: write ${{NAME}} or $$");
        }
    }
    out.push_str(rest);
    out
}

/// Names of the `[[bin]]` targets in Cargo.toml.
fn bins() -> BTreeSet<String> {
    let manifest: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    manifest["bin"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect()
}

fn worker_bin(stage: StageName) -> String {
    format!("aptix-{}", stage.as_str())
}

/// The ingress partitions and queue type a set of `APTIX__` variables selects (the defaults, 1
/// and classic, when unset).
fn layout(env: &BTreeMap<String, String>) -> (u16, QueueType) {
    let partitions: u16 = env.get("APTIX__AMQP__INGRESS_PARTITIONS").map_or(1, |p| {
        p.parse().unwrap_or_else(|_| panic!("APTIX__AMQP__INGRESS_PARTITIONS={p:?}"))
    });
    let queue_type = match env.get("APTIX__AMQP__QUEUE_TYPE").map(String::as_str) {
        None | Some("classic") => QueueType::Classic,
        Some("quorum") => QueueType::Quorum,
        Some(other) => panic!("APTIX__AMQP__QUEUE_TYPE={other:?}"),
    };
    (partitions, queue_type)
}

/// Every queue and exchange name of `env`'s prefix and layout, for the pipeline's stages.
fn topology_of(env: &BTreeMap<String, String>) -> Topology {
    let (partitions, queue_type) = layout(env);
    Topology::new(&env["APTIX__AMQP__PREFIX"])
        .with_layout(partitions, queue_type)
        .with_stages(&aptix::stages::names())
}

/// Whether `env` selects the Qdrant server backend (vector.url set) rather than the embedded
/// store, which only one process can open.
fn vector_server(env: &BTreeMap<String, String>) -> bool {
    env.get("APTIX__VECTOR__URL").is_some_and(|url| !url.is_empty())
}

const REGEX_META: &str = r"\.+*?()|[]{}^$";

/// The regex (RabbitMQ management API syntax) that names exactly the ingress partitions of
/// `topology`: every queue under its consistent-hash exchange's name and a dot.
fn partition_queue_regex(topology: &Topology) -> String {
    let mut literal = String::new();
    for c in topology.partition_exchange(topology.partitions()).chars() {
        if REGEX_META.contains(c) {
            literal.push('\\');
        }
        literal.push(c);
    }
    format!("^{literal}\\..*")
}

/// The names a `^LITERAL.*` regex matches start with LITERAL (unescaped); any other form of
/// regex is refused.
fn regex_literal_prefix(pattern: &str) -> String {
    let body = pattern
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix(".*"))
        .unwrap_or_else(|| panic!("{pattern:?} is not of the form ^LITERAL.*"));
    let mut literal = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let escaped = chars.next();
                literal.push(escaped.unwrap_or_else(|| panic!("{pattern:?} ends in a backslash")));
            }
            c if REGEX_META.contains(c) => panic!("{pattern:?}: unescaped {c:?}"),
            c => literal.push(c),
        }
    }
    literal
}

/// `(scheme, userinfo, host, port, path)` of a `scheme://userinfo@host:port/path` URL.
fn url_parts(url: &str) -> (&str, &str, &str, u16, &str) {
    let (scheme, rest) = url.split_once("://").unwrap_or_else(|| panic!("not a URL: {url}"));
    let (userinfo, rest) = rest.split_once('@').unwrap_or_else(|| panic!("no user in {url}"));
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let (host, port) = authority.rsplit_once(':').unwrap_or_else(|| panic!("no port in {url}"));
    let port = port.parse().unwrap_or_else(|_| panic!("bad port in {url}"));
    (scheme, userinfo, host, port, path)
}

/// `(major, minor)` of a version such as `1.20`, `v1.19.0` or `=1.20.1`.
fn major_minor(version: &str) -> (u64, u64) {
    let mut parts = version.trim_start_matches(['v', '=', '^', '~']).split('.');
    let mut next = || -> u64 {
        parts.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("version {version:?}"))
    };
    (next(), next())
}

/// The built-in defaults, straight from the TOML the binary embeds.
fn defaults() -> toml::Value {
    toml::from_str(aptix::config::DEFAULTS_TOML).unwrap()
}

fn request_timeout_secs() -> u64 {
    let ms = defaults()["llm"]["request_timeout_ms"].as_integer().unwrap();
    u64::try_from(ms).unwrap().div_ceil(1000)
}

/// Port of an `ADDR:PORT` listen address.
fn port_of(listen: &str) -> u16 {
    listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {listen:?}"))
}

/// Compose durations such as `30s`, `11m`, `1m30s`, in seconds.
fn duration_secs(s: &str) -> u64 {
    let mut total = 0;
    let mut num = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().unwrap_or_else(|_| panic!("bad duration {s:?}"));
        num.clear();
        total += match c {
            's' => n,
            'm' => n * 60,
            'h' => n * 3600,
            _ => panic!("bad duration {s:?}"),
        };
    }
    assert!(num.is_empty(), "duration {s:?} needs a unit");
    total
}

/// Runs `aptix config` with exactly `vars` in its environment and returns the effective
/// configuration it prints, or its error output.
fn aptix_config(vars: &BTreeMap<String, String>) -> Result<toml::Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_aptix"))
        .arg("config")
        .env_clear()
        .envs(vars)
        .output()
        .expect("running aptix config");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("aptix config prints TOML"))
}

/// Proves each `APTIX__SECTION__KEY` in `vars` is a configuration key: the configuration loads
/// with all of them set (unknown keys are refused) and each value shows up under its key.
fn assert_config_keys(source: &str, vars: &BTreeMap<String, String>) {
    let aptix: Vec<_> = vars.keys().filter(|k| k.starts_with("APTIX__")).collect();
    assert!(!aptix.is_empty(), "{source}: no APTIX__ variables found");
    let config = aptix_config(vars)
        .unwrap_or_else(|e| panic!("{source}: the configuration does not load:\n{e}"));
    for name in aptix {
        let path: Vec<String> =
            name["APTIX__".len()..].split("__").map(str::to_lowercase).collect();
        let mut node = &config;
        for part in &path {
            node = node.get(part).unwrap_or_else(|| {
                panic!("{source}: {name} is not a configuration key (no `{}`)", path.join("."))
            });
        }
        let shown = match node {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => panic!("{source}: {name} sets a whole table: {other:?}"),
        };
        // Secrets and URL passwords print as ***.
        if !shown.contains("***") {
            assert_eq!(shown, vars[name], "{source}: {name} did not reach `{}`", path.join("."));
        }
    }
}

// --- compose -------------------------------------------------------------------------------

fn compose() -> Yaml {
    let mut docs = yaml_docs("docker-compose.yml");
    assert_eq!(docs.len(), 1, "docker-compose.yml holds one document");
    docs.remove(0)
}

fn services(compose: &Yaml) -> BTreeMap<String, Yaml> {
    compose["services"]
        .as_mapping()
        .expect("services")
        .iter()
        .map(|(k, v)| (yaml_str(k, "service name").to_owned(), v.clone()))
        .collect()
}

/// A service's environment (map or `KEY=VALUE` list form), interpolated.
fn compose_env(service: &Yaml) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    match &service["environment"] {
        Yaml::Null => {}
        Yaml::Mapping(m) => {
            for (k, v) in m {
                env.insert(yaml_str(k, "variable").to_owned(), interpolate(&scalar(v)));
            }
        }
        Yaml::Sequence(s) => {
            for item in s {
                let (k, v) = yaml_str(item, "variable").split_once('=').expect("KEY=VALUE");
                env.insert(k.to_owned(), interpolate(v));
            }
        }
        other => panic!("environment is neither a map nor a list: {other:?}"),
    }
    env
}

#[test]
fn every_yaml_file_parses() {
    let mut files = vec!["docker-compose.yml".to_owned()];
    let mut stack = vec![root().join("deploy")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
                files.push(path.strip_prefix(root()).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    assert!(files.len() > 5, "expected compose and the Kubernetes manifests, found {files:?}");
    for file in files {
        let docs = yaml_docs(&file);
        assert!(!docs.is_empty(), "{file} is empty");
        for doc in docs {
            assert!(doc.is_mapping(), "{file}: a document is not a mapping");
        }
    }
}

#[test]
fn compose_runs_each_stage_from_one_image_with_health_checks() {
    let compose = compose();
    let services = services(&compose);
    let bins = bins();

    // Infrastructure.
    let rabbit = yaml_str(&services["rabbitmq"]["image"], "rabbitmq image");
    assert!(
        (rabbit.starts_with("rabbitmq:3") || rabbit.starts_with("rabbitmq:4"))
            && rabbit.ends_with("-management"),
        "RabbitMQ with the management plugin, 3.x or 4.x: {rabbit}"
    );
    assert!(yaml_str(&services["postgres"]["image"], "postgres image").starts_with("postgres:"));
    // Qdrant: pinned to the 1.19.x servers the qdrant-client crate (1.20) speaks to, never
    // `latest`, which would move to servers the client does not know.
    let qdrant = yaml_str(&services["qdrant"]["image"], "qdrant image");
    let tag = qdrant
        .strip_prefix("qdrant/qdrant:")
        .unwrap_or_else(|| panic!("Qdrant's image, with a tag: {qdrant}"));
    assert_ne!(tag, "latest", "pin the Qdrant server's version");
    assert!(tag.starts_with("v1.19."), "Qdrant server 1.19.x, not {tag}");
    let manifest: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    let client = manifest["dependencies"]["qdrant-client"]["version"].as_str().expect("version");
    let ((client_major, client_minor), (server_major, server_minor)) =
        (major_minor(client), major_minor(tag));
    assert!(
        client_major == server_major && client_minor.abs_diff(server_minor) <= 1,
        "qdrant-client {client} and the Qdrant server {tag} must be at most one minor version apart"
    );

    // Every service but the one-shot ones (migrate, rabbitmq-setup) has a health check; every
    // Aptix service is built from deploy/Dockerfile as the same image and runs a real binary.
    let mut image = None;
    for (name, svc) in &services {
        if svc.get("restart").map(scalar).as_deref() != Some("no") {
            assert!(svc["healthcheck"]["test"].is_sequence(), "service {name} has no health check");
        }
        if svc.get("build").is_none() {
            continue;
        }
        assert_eq!(
            yaml_str(&svc["build"]["dockerfile"], "dockerfile"),
            "deploy/Dockerfile",
            "{name}"
        );
        assert_eq!(yaml_str(&svc["build"]["context"], "context"), ".", "{name}");
        let this = yaml_str(&svc["image"], "image").to_owned();
        assert_eq!(
            image.get_or_insert_with(|| this.clone()),
            &this,
            "{name}: every Aptix service uses one image"
        );
        let command = string_list(&svc["command"], "command");
        assert!(
            bins.contains(&command[0]),
            "service {name} runs {:?}, not a [[bin]] target ({bins:?})",
            command[0]
        );
    }
    assert!(root().join("deploy/Dockerfile").is_file());

    let migrate = &services["migrate"];
    assert_eq!(string_list(&migrate["command"], "command"), ["aptix", "migrate"]);
    assert_eq!(scalar(&migrate["restart"]), "no", "migrate runs once");

    let request_timeout = request_timeout_secs();
    for stage in aptix::stages::names() {
        let name = stage.as_str();
        let svc =
            services.get(name).unwrap_or_else(|| panic!("no compose service for the {name} stage"));
        assert_eq!(string_list(&svc["command"], "command"), [worker_bin(stage)], "{name}");
        // `--scale` starts copies: no fixed container name, no published host port.
        assert!(
            svc.get("container_name").is_none(),
            "{name} has a container_name and cannot scale"
        );
        assert!(svc.get("ports").is_none(), "{name} publishes ports and cannot scale");
        assert_eq!(
            yaml_str(&svc["depends_on"]["migrate"]["condition"], "condition"),
            "service_completed_successfully",
            "{name} waits for the migrations"
        );
        let env = compose_env(svc);
        assert_eq!(
            env.get("APTIX__PIPELINE__MIGRATE_ON_START").map(String::as_str),
            Some("false"),
            "{name}"
        );
        let listen = env
            .get("APTIX__TELEMETRY__METRICS_LISTEN")
            .unwrap_or_else(|| panic!("{name}: no metrics port"));
        assert!(
            listen.starts_with("0.0.0.0:"),
            "{name} must serve health beyond loopback: {listen}"
        );
        let check = string_list(&svc["healthcheck"]["test"], "healthcheck").join(" ");
        assert!(
            check.contains(&format!("/dev/tcp/127.0.0.1/{}", port_of(listen)))
                && check.contains("GET /readyz "),
            "{name}'s health check must ask /readyz on the metrics port {listen}: {check}"
        );
        let grace = svc.get("stop_grace_period").map_or(10, |g| duration_secs(&scalar(g)));
        if stage == StageName::new("invoke") {
            assert!(
                grace >= request_timeout,
                "invoke's stop_grace_period {grace}s < an LLM call ({request_timeout}s)"
            );
        }
    }
    // Scaled retrieval needs the Qdrant server: the embedded store is locked per process.
    let retrieve = &services["retrieve"];
    assert_eq!(compose_env(retrieve)["APTIX__VECTOR__URL"], "http://qdrant:6334");
    assert!(retrieve["depends_on"].get("qdrant").is_some(), "retrieve waits for Qdrant");
}

#[test]
fn compose_variables_are_configuration_keys() {
    let compose = compose();
    let mut all = BTreeMap::new();
    for (name, svc) in services(&compose) {
        if svc.get("build").is_none() {
            continue;
        }
        for (k, v) in compose_env(&svc) {
            // The console reaches the broker as its own, narrower user.
            if name == "console" && k.starts_with("APTIX__AMQP__") && k.ends_with("URL") {
                assert!(v.contains("aptix-console:"), "the console's {k}: {v}");
                continue;
            }
            if let Some(old) = all.insert(k.clone(), v.clone()) {
                assert_eq!(old, v, "{k} differs between services ({name})");
            }
        }
    }
    assert_config_keys("docker-compose.yml", &all);
}

#[test]
fn an_unknown_variable_is_refused() {
    // The check above is only as good as this: a misspelt key must stop the process.
    let vars =
        BTreeMap::from([("APTIX__TELEMETRY__METRICS_LISTN".to_owned(), "0.0.0.0:9464".to_owned())]);
    let err = aptix_config(&vars).expect_err("an unknown key must be refused");
    assert!(err.contains("metrics_listn"), "the error names the key: {err}");
}

// --- image ---------------------------------------------------------------------------------

#[test]
fn dockerfile_ships_every_binary_and_runs_as_non_root() {
    let dockerfile = read("deploy/Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).collect();

    // The binaries copied out of the build are exactly the [[bin]] targets.
    let loop_line =
        lines.iter().find(|l| l.starts_with("&& for bin in ")).expect("the `for bin in` copy loop");
    let listed: BTreeSet<String> = loop_line["&& for bin in ".len()..]
        .split(';')
        .next()
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(listed, bins(), "deploy/Dockerfile copies other binaries than Cargo.toml builds");
    assert!(dockerfile.contains("cargo build --release --locked --bins"));
    assert!(
        dockerfile.contains("--mount=type=cache,target=/usr/local/cargo/registry"),
        "cargo registry cache mount"
    );

    // Runtime: Debian slim, CA certificates, a non-root numeric user.
    let from: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert!(from.first().unwrap().starts_with("FROM rust:"), "Rust builder stage");
    assert!(
        from.last().unwrap().starts_with("FROM debian:") && from.last().unwrap().contains("-slim")
    );
    assert!(dockerfile.contains("ca-certificates"));
    let user = lines.iter().rev().find(|l| l.starts_with("USER ")).expect("a USER line")
        ["USER ".len()..]
        .trim();
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric uid (Kubernetes runAsNonRoot needs it)");
    assert_ne!(uid, 0, "the image must not run as root");

    // Everything the build copies from the context exists and is let through .dockerignore.
    let ignore = read(".dockerignore");
    let allowed: BTreeSet<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .map(|p| p.trim_end_matches('/'))
        .collect();
    assert!(ignore.lines().any(|l| l.trim() == "*"), ".dockerignore is an allow-list");
    for line in lines.iter().filter(|l| l.starts_with("COPY ") && !l.contains("--from=")) {
        let args: Vec<&str> = line.split_whitespace().skip(1).collect();
        for src in &args[..args.len() - 1] {
            let src = src.trim_end_matches('/');
            assert!(
                root().join(src).exists(),
                "deploy/Dockerfile copies {src}, which does not exist"
            );
            assert!(allowed.contains(src), ".dockerignore does not let {src} through");
        }
    }
    // The workspace loads every member's manifest, and the build reads the patched dependencies
    // (vendor/README.md): each is copied and let through.
    let copied: BTreeSet<&str> = lines
        .iter()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from="))
        .flat_map(|l| {
            let args: Vec<&str> = l.split_whitespace().skip(1).collect();
            args[..args.len() - 1].iter().map(|a| a.trim_end_matches('/')).collect::<Vec<_>>()
        })
        .collect();
    let manifest: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap().iter();
    let mut read_by_build: Vec<&str> =
        members.filter_map(toml::Value::as_str).filter(|m| *m != ".").collect();
    if let Some(patches) = manifest.get("patch").and_then(|p| p.get("crates-io")) {
        let paths = patches.as_table().unwrap().values();
        read_by_build.extend(paths.filter_map(|d| d.get("path")?.as_str()));
    }
    assert!(read_by_build.contains(&"vendor/amq-protocol-types"), "{read_by_build:?}");
    let covers = |set: &BTreeSet<&str>, path: &str| {
        set.iter().any(|c| path == *c || path.starts_with(&format!("{c}/")))
    };
    for path in read_by_build {
        assert!(
            covers(&copied, path),
            "deploy/Dockerfile does not copy {path}, which the build reads"
        );
        assert!(covers(&allowed, path), ".dockerignore does not let {path} through");
    }
    // What the crate embeds at compile time is in the context.
    for embedded in ["aptix.example.toml", "migrations"] {
        assert!(
            allowed.contains(embedded),
            ".dockerignore drops {embedded}, which the build embeds"
        );
    }
}

// --- Kubernetes ----------------------------------------------------------------------------

struct K8s {
    docs: Vec<(String, Yaml)>,
}

impl K8s {
    fn load() -> Self {
        let mut docs = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(root().join("deploy/k8s"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
            .collect();
        names.sort();
        for name in names {
            for doc in yaml_docs(&format!("deploy/k8s/{name}")) {
                docs.push((name.clone(), doc));
            }
        }
        K8s { docs }
    }

    fn of_kind(&self, kind: &str) -> Vec<&Yaml> {
        self.docs.iter().map(|(_, d)| d).filter(|d| d["kind"].as_str() == Some(kind)).collect()
    }

    fn named(&self, kind: &str, name: &str) -> &Yaml {
        self.of_kind(kind)
            .into_iter()
            .find(|d| d["metadata"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no {kind} named {name} in deploy/k8s"))
    }

    /// Every variable the pods get: the ConfigMap, the Secret template, and `env` entries.
    fn env(&self) -> BTreeMap<String, String> {
        let mut vars = BTreeMap::new();
        let sources = self
            .of_kind("ConfigMap")
            .into_iter()
            .map(|d| &d["data"])
            .chain(self.of_kind("Secret").into_iter().map(|d| &d["stringData"]));
        for data in sources {
            for (k, v) in data.as_mapping().into_iter().flatten() {
                vars.insert(yaml_str(k, "key").to_owned(), scalar(v));
            }
        }
        for (_, c) in self.containers() {
            // Entries read from a Secret's key (the console's own broker URL) name a key the
            // Secret template holds; the workers' values are the ones above.
            let literal =
                c["env"].as_sequence().into_iter().flatten().filter(|e| e.get("value").is_some());
            for e in literal {
                vars.insert(yaml_str(&e["name"], "env name").to_owned(), scalar(&e["value"]));
            }
        }
        vars
    }

    fn containers(&self) -> Vec<(String, &Yaml)> {
        let mut out = Vec::new();
        for kind in ["Deployment", "Job"] {
            for d in self.of_kind(kind) {
                let name = yaml_str(&d["metadata"]["name"], "name").to_owned();
                for c in
                    d["spec"]["template"]["spec"]["containers"].as_sequence().expect("containers")
                {
                    out.push((name.clone(), c));
                }
            }
        }
        out
    }
}

#[test]
fn kubernetes_manifests_are_namespace_agnostic_and_listed() {
    let k8s = K8s::load();
    for (file, doc) in &k8s.docs {
        assert!(
            doc["apiVersion"].is_string() && doc["kind"].is_string(),
            "{file}: apiVersion and kind"
        );
        assert!(doc["metadata"]["name"].is_string(), "{file}: metadata.name");
        assert!(doc["metadata"].get("namespace").is_none(), "{file}: no namespace (apply with -n)");
    }
    let kustomization = &yaml_docs("deploy/k8s/kustomization.yaml")[0];
    let listed: BTreeSet<String> =
        string_list(&kustomization["resources"], "resources").into_iter().collect();
    let files: BTreeSet<String> = k8s.docs.iter().map(|(f, _)| f.clone()).collect();
    // The examples (the Secrets, a RabbitMQ) are applied by hand; `../rabbitmq` generates the
    // RabbitMQ ConfigMap from deploy/rabbitmq/.
    let mut expected: BTreeSet<String> =
        files.into_iter().filter(|f| !f.ends_with(".example.yaml")).collect();
    expected.insert("../rabbitmq".to_owned());
    assert_eq!(listed, expected, "kustomization.yaml lists every manifest but the examples");
    // Every ConfigMap and Secret a pod reads is defined here.
    for (owner, c) in k8s.containers() {
        for from in c["envFrom"].as_sequence().into_iter().flatten() {
            if let Some(name) = from["configMapRef"]["name"].as_str() {
                k8s.named("ConfigMap", name);
            }
            if let Some(name) = from["secretRef"]["name"].as_str() {
                k8s.named("Secret", name);
            }
            assert!(
                from.get("configMapRef").is_some() || from.get("secretRef").is_some(),
                "{owner}: envFrom"
            );
        }
    }
}

#[test]
fn kubernetes_variables_are_configuration_keys() {
    assert_config_keys("deploy/k8s", &K8s::load().env());
}

#[test]
fn kubernetes_has_a_probed_deployment_and_a_queue_scaler_per_stage() {
    let k8s = K8s::load();
    let bins = bins();
    let env = k8s.env();
    let topology = topology_of(&env);
    let metrics_port = port_of(&env["APTIX__TELEMETRY__METRICS_LISTEN"]);
    let request_timeout = request_timeout_secs();

    let uid = read("deploy/Dockerfile")
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .and_then(|u| u.split(':').next()?.trim().parse::<u64>().ok())
        .expect("the image's uid");

    for (owner, c) in k8s.containers() {
        let command = string_list(&c["command"], "command");
        assert!(bins.contains(&command[0]), "{owner} runs {:?}, not a [[bin]] target", command[0]);
        assert!(c["resources"]["requests"]["memory"].is_string(), "{owner}: memory request");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{owner}: memory limit");
    }
    let job = k8s.named("Job", "aptix-migrate");
    let job_container = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(string_list(&job_container["command"], "command"), ["aptix", "migrate"]);

    for stage in aptix::stages::names() {
        let name = format!("aptix-{}", stage.as_str());
        let deployment = k8s.named("Deployment", &name);
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true), "{name}");
        assert_eq!(
            pod["securityContext"]["runAsUser"].as_u64(),
            Some(uid),
            "{name} runs as the image's user"
        );
        let containers = pod["containers"].as_sequence().unwrap();
        assert_eq!(containers.len(), 1, "{name}: one container");
        let c = &containers[0];
        assert_eq!(string_list(&c["command"], "command"), [worker_bin(stage)], "{name}");

        let port = c["ports"]
            .as_sequence()
            .and_then(|ports| ports.iter().find(|p| p["name"].as_str() == Some("metrics")))
            .unwrap_or_else(|| panic!("{name}: a port named metrics"));
        assert_eq!(
            port["containerPort"].as_u64(),
            Some(u64::from(metrics_port)),
            "{name}: metrics port"
        );
        for (probe, path) in [
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"].as_str(), Some(path), "{name}: {probe}");
            assert_eq!(get["port"].as_str(), Some("metrics"), "{name}: {probe} port");
        }

        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        assert!(grace >= 30, "{name}: terminationGracePeriodSeconds {grace}");
        if stage == StageName::new("invoke") {
            assert!(
                grace >= request_timeout,
                "invoke's grace period {grace}s < an LLM call ({request_timeout}s)"
            );
        }

        // KEDA: one ScaledObject per stage, except retrieve on the embedded vector store, which
        // one process locks: that retrieve stays at one replica.
        let scalers: Vec<&Yaml> = k8s
            .of_kind("ScaledObject")
            .into_iter()
            .filter(|s| s["spec"]["scaleTargetRef"]["name"].as_str() == Some(&name))
            .collect();
        if stage == StageName::new("retrieve") && !vector_server(&env) {
            assert!(
                scalers.is_empty(),
                "{name} must not autoscale without a Qdrant server (APTIX__VECTOR__URL): the \
                 embedded store is locked by one process"
            );
            assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(1), "{name}: one replica");
            continue;
        }
        assert_eq!(scalers.len(), 1, "{name}: one ScaledObject");
        let spec = &scalers[0]["spec"];
        let triggers = spec["triggers"].as_sequence().unwrap();
        assert_eq!(triggers.len(), 1, "{name}: one trigger");
        let trigger = &triggers[0];
        assert_eq!(trigger["type"].as_str(), Some("rabbitmq"), "{name}");

        let min = spec["minReplicaCount"].as_u64().unwrap_or(0);
        let max = spec["maxReplicaCount"].as_u64().expect("maxReplicaCount");
        assert!(min >= 1 && min <= max, "{name}: replicas {min}..={max}");
        if topology.is_ingress(stage) && topology.partitions() > 1 {
            assert_partition_sum_trigger(&k8s, &topology, trigger, &name);
            // Each partition has one active consumer and a replica holds at least one.
            assert_eq!(
                max,
                u64::from(topology.partitions()),
                "{name}: the scaler stops at APTIX__AMQP__INGRESS_PARTITIONS"
            );
        } else {
            assert_queue_trigger(&k8s, trigger, &topology.stage_queue(stage), &name);
            if topology.is_ingress(stage) {
                // One ingress queue, with a single active consumer: more replicas only stand by.
                assert!(max <= 2, "{name} consumes one single-active-consumer queue: cap it at 2");
            }
        }
    }
}

/// The Secret key a trigger's TriggerAuthentication passes to KEDA as `host`, and its value in
/// the Secret template.
fn trigger_host(k8s: &K8s, trigger: &Yaml, what: &str) -> (String, String) {
    let auth = k8s.named(
        "TriggerAuthentication",
        yaml_str(&trigger["authenticationRef"]["name"], "authenticationRef"),
    );
    let host = auth["spec"]["secretTargetRef"]
        .as_sequence()
        .and_then(|refs| refs.iter().find(|r| r["parameter"].as_str() == Some("host")))
        .unwrap_or_else(|| panic!("{what}: its TriggerAuthentication maps no `host`"));
    let key = yaml_str(&host["key"], "secret key");
    let secret = k8s.named("Secret", yaml_str(&host["name"], "secret name"));
    let value = secret["stringData"]
        .get(key)
        .map(scalar)
        .unwrap_or_else(|| panic!("{what}: no {key} in the Secret template"));
    (key.to_owned(), value)
}

/// A trigger on one queue's depth, read over AMQP as `aptix-monitor` (queue depths only) on the
/// workers' broker.
fn assert_queue_trigger(k8s: &K8s, trigger: &Yaml, queue: &str, what: &str) {
    let meta = &trigger["metadata"];
    assert_eq!(meta["queueName"].as_str(), Some(queue), "{what}: the queue it consumes");
    assert_eq!(meta["protocol"].as_str(), Some("amqp"), "{what}");
    let (key, url) = trigger_host(k8s, trigger, what);
    assert_monitor_url(k8s, &key, &url, what);
}

/// `url` (`key` of the Secret) is the `aptix-monitor` user's, on the workers' broker host.
fn assert_monitor_url(k8s: &K8s, key: &str, url: &str, what: &str) {
    let env = k8s.env();
    let (_, userinfo, host, _, _) = url_parts(url);
    let (_, _, worker_host, _, _) = url_parts(&env["APTIX__AMQP__URL"]);
    let user = userinfo.split(':').next().unwrap_or_default();
    assert_eq!(user, "aptix-monitor", "{what}: KEDA reads depths as the monitor user ({key})");
    assert_eq!(host, worker_host, "{what}: {key} names the workers' broker");
}

/// A trigger on the sum of the depths of every ingress partition: KEDA's `http` protocol (the
/// management API, the only one that matches queues by regex) with a regex that names exactly
/// the partition queues, as the workers' user.
fn assert_partition_sum_trigger(k8s: &K8s, topology: &Topology, trigger: &Yaml, what: &str) {
    let meta = &trigger["metadata"];
    assert_eq!(meta["protocol"].as_str(), Some("http"), "{what}: regex and sum need http");
    // KEDA's metadata values are strings: a YAML boolean would be refused.
    assert_eq!(meta["useRegex"].as_str(), Some("true"), "{what}: useRegex: \"true\"");
    assert_eq!(meta["operation"].as_str(), Some("sum"), "{what}: the partitions' depths summed");
    assert_eq!(meta["mode"].as_str(), Some("QueueLength"), "{what}");

    let pattern = yaml_str(&meta["queueName"], "queueName");
    assert_eq!(
        pattern,
        partition_queue_regex(topology),
        "{what}: the partition queues of APTIX__AMQP__PREFIX and APTIX__AMQP__INGRESS_PARTITIONS"
    );
    // It names every partition queue and no other queue: not the single ingress queue, the
    // stage, dead-letter and delay queues, nor another layout's partitions (`p160` starts with
    // `p16`'s digits).
    let literal = regex_literal_prefix(pattern);
    let partitions = topology.ingress_queues();
    assert_eq!(partitions.len(), usize::from(topology.partitions()));
    for queue in &partitions {
        assert!(queue.starts_with(&literal), "{what}: {pattern} misses {queue}");
    }
    let mut others = vec![topology.requests(), topology.dead(), topology.unrouted()];
    others.extend(topology.stages().iter().skip(1).map(|s| topology.stage_queue(*s)));
    others.extend(RETRY_TIERS_MS.map(|tier| topology.delay_exchange(tier)));
    for factor in [2, 10] {
        others.extend(topology.ingress_queues_of(topology.partitions() * factor));
    }
    for queue in &others {
        assert!(!queue.starts_with(&literal), "{what}: {pattern} also matches {queue}");
    }
    // KEDA reads one page of matching queues and fails when there are more.
    let page_size: usize = meta["pageSize"].as_str().map_or(100, |p| p.parse().expect("pageSize"));
    assert!(page_size >= partitions.len(), "{what}: pageSize {page_size} < the partitions");

    // The management API's URL, as the monitor user on the workers' broker.
    let (key, url) = trigger_host(k8s, trigger, what);
    let (scheme, _, _, port, path) = url_parts(&url);
    assert_eq!(scheme, "http", "{what}: {key} is a management-API URL: {url}");
    assert_eq!(port, 15672, "{what}: {key} names the management port: {url}");
    assert_monitor_url(k8s, &key, &url, what);
    assert!(matches!(path, "/" | "/%2f" | "/%2F"), "{what}: {key} names the vhost `/`: {url}");
}

#[test]
fn kubernetes_runs_quorum_queues_a_partitioned_ingress_and_a_qdrant_server() {
    let env = K8s::load().env();
    let (partitions, queue_type) = layout(&env);
    // The manifests' RabbitMQ is a 3-node cluster (rabbitmq-cluster.example.yaml): the queues
    // are replicated over it.
    assert_eq!(queue_type, QueueType::Quorum, "deploy/k8s: APTIX__AMQP__QUEUE_TYPE=quorum");
    // Validate scales out over the partitions (with one, extra replicas only stand by).
    assert!(
        partitions > 1 && partitions.is_power_of_two(),
        "deploy/k8s: APTIX__AMQP__INGRESS_PARTITIONS is a power of two above 1, not {partitions}"
    );
    // Retrieve scales out, which only a Qdrant server allows.
    assert!(vector_server(&env), "deploy/k8s selects the Qdrant server (APTIX__VECTOR__URL)");

    let rabbit = &yaml_docs("deploy/k8s/rabbitmq-cluster.example.yaml")[0];
    assert_eq!(rabbit["spec"]["replicas"].as_u64(), Some(3), "RabbitMQ runs as 3 nodes");
    let plugins = string_list(&rabbit["spec"]["rabbitmq"]["additionalPlugins"], "plugins");
    assert!(plugins.iter().any(|p| p == "rabbitmq_consistent_hash_exchange"), "{plugins:?}");
    // The example Qdrant server is pinned to the line qdrant-client speaks to.
    let docs = yaml_docs("deploy/k8s/qdrant.example.yaml");
    let qdrant = docs.iter().find(|d| d["kind"].as_str() == Some("StatefulSet")).expect("Qdrant");
    let image = yaml_str(&qdrant["spec"]["template"]["spec"]["containers"][0]["image"], "image");
    let tag = image.strip_prefix("qdrant/qdrant:").expect("qdrant/qdrant:<tag>");
    assert!(tag.starts_with("v1.19."), "the Kubernetes Qdrant is pinned to 1.19.x, not {tag}");
    let service = docs.iter().find(|d| d["kind"].as_str() == Some("Service")).expect("Service");
    assert_eq!(service["metadata"]["name"].as_str(), Some("qdrant"), "APTIX__VECTOR__URL's host");
}

#[test]
fn the_helpers_read_what_compose_writes() {
    assert_eq!(interpolate("${A:-http://sim:8089/v1}"), "http://sim:8089/v1");
    assert_eq!(interpolate("x${A}y$$"), "xy$");
    assert_eq!(duration_secs("660s") + duration_secs("1m30s"), 750);
    assert_eq!(port_of("0.0.0.0:9464"), 9464);
    assert_eq!((major_minor("v1.19.0"), major_minor("1.20")), ((1, 19), (1, 20)));
    assert_eq!(url_parts("http://u:p@h:15672/"), ("http", "u:p", "h", 15672, "/"));
    let topology = Topology::new("a-b").with_layout(16, QueueType::Quorum);
    assert_eq!(partition_queue_regex(&topology), r"^a-b\.requests\.p16\..*");
    assert_eq!(regex_literal_prefix(&partition_queue_regex(&topology)), "a-b.requests.p16.");
}
