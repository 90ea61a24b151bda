//! The shipped RabbitMQ configuration, `deploy/rabbitmq/`: the definitions match the topology;
//! the two users and their permissions are protocol v2's (workers own the prefix, clients may
//! only publish to the entry exchange and use their reply queues); the policies bound what
//! clients and failures can make the broker keep; `max_message_size` equals
//! `amqp.max_message_bytes`; setup.sh writes the same definitions; compose and Kubernetes wire
//! all of it, with the consistent-hash exchange plugin the ingress partitions need (and
//! Kubernetes with a 3-node cluster for its quorum queues), and no Aptix process uses `guest`.
//! tests/broker_permissions.rs proves the permissions against the real broker.

use std::process::Command;

use aptix::broker::RETRY_TIERS_MS;
use serde_json::{json, Value as Json};

use super::*;

const WORKER: &str = "aptix-worker";
const CLIENT: &str = "aptix-client";
const MONITOR: &str = "aptix-monitor";
const CONSOLE: &str = "aptix-console";
const SETUP: &str = "deploy/rabbitmq/setup.sh";
/// The plugin behind the ingress partitions' consistent-hash exchange.
const HASH_PLUGIN: &str = "rabbitmq_consistent_hash_exchange";

/// The tags of each user: `aptix-worker` may use the management API (KEDA sums the ingress
/// partitions' depths through it with the workers' URL), nobody administers anything.
fn expected_tags(user: &str) -> Json {
    if user == CLIENT {
        json!([])
    } else {
        json!(["management"])
    }
}

fn definitions() -> Json {
    serde_json::from_str(&read("deploy/rabbitmq/definitions.json")).unwrap()
}

/// The permissions of protocol v2 on the vhost `/`, for the prefix regex `p`. The workers also
/// write to `amq.default`: they publish stage messages through the default exchange, and the
/// delay queues dead-letter into it (RabbitMQ checks that on their declaration).
fn expected_permissions(p: &str) -> Json {
    let all = format!("^{p}\\..*");
    // Clients' reply queues: per session, or per backend instance.
    let session = format!("^{p}\\.(session|instance)\\..*");
    json!([
        {"user": WORKER, "vhost": "/", "configure": all, "write": format!("^({p}\\..*|amq\\.default)$"),
         "read": all},
        {"user": CLIENT, "vhost": "/", "configure": session, "write": format!("^{p}\\.requests$"),
         "read": session},
        // Queue depths only (KEDA): no permission at all.
        {"user": MONITOR, "vhost": "/", "configure": "^$", "write": "^$", "read": "^$"},
        // The console: take dead letters, publish replays; declare nothing.
        {"user": CONSOLE, "vhost": "/", "configure": "^$",
         "write": format!("^({p}\\.requests|amq\\.default)$"), "read": format!("^{p}\\.dead(\\.[a-z0-9_-]+)?$")},
    ])
}

/// The queue policies for the prefix regex `p`, named after `name`.
fn expected_policies(p: &str, name: &str) -> Json {
    // Reply queues: gone after a day unused, at most 10,000 replies (the oldest dropped first;
    // every reply is also in PostgreSQL). Dead letters and unrouted replies: 100,000 messages,
    // 1 GiB, 14 days.
    let sessions = json!({"expires": 86_400_000, "max-length": 10_000, "overflow": "drop-head"});
    // An instance queue carries the replies of all its backend's sessions: 100,000 at most.
    let instances = json!({"expires": 86_400_000, "max-length": 100_000, "overflow": "drop-head"});
    // Each look at a dead letter is a delivery on a quorum queue, which RabbitMQ 4 drops after
    // 20 by default: a delivery limit no look reaches (3.x refuses -1).
    let looks = 1_000_000_000u64;
    let bounded = json!({"max-length": 100_000, "max-length-bytes": 1u64 << 30,
                         "message-ttl": 14u64 * 24 * 3600 * 1000, "delivery-limit": looks});
    // One tenant's own dead letters and unrouted replies: 10,000 messages, 256 MiB, 14 days,
    // so its flood evicts only its own.
    let per_tenant = json!({"max-length": 10_000, "max-length-bytes": 256u64 << 20,
                            "message-ttl": 14u64 * 24 * 3600 * 1000, "delivery-limit": looks});
    let policy = |suffix: &str, pattern: String, definition: &Json| {
        json!({"vhost": "/", "name": format!("{name}-{suffix}"), "pattern": pattern,
               "apply-to": "queues", "priority": 0, "definition": definition})
    };
    json!([
        policy("sessions", format!("^{p}\\.session\\."), &sessions),
        policy("instances", format!("^{p}\\.instance\\."), &instances),
        policy("dead", format!("^{p}\\.dead$"), &bounded),
        policy("unrouted", format!("^{p}\\.unrouted$"), &bounded),
        policy("dead-tenant", format!("^{p}\\.dead\\.[a-z0-9_-]+$"), &per_tenant),
        policy("unrouted-tenant", format!("^{p}\\.unrouted\\.[a-z0-9_-]+$"), &per_tenant),
    ])
}

/// The name of a queue or exchange definition, after checking it is durable, kept when unused,
/// and in the default vhost.
fn durable_entity(def: &Json) -> String {
    let name = def["name"].as_str().expect("a name").to_owned();
    assert_eq!(def["vhost"], "/", "{name}");
    assert_eq!(def["durable"], true, "{name} is durable");
    assert_eq!(def["auto_delete"], false, "{name}");
    name
}

#[test]
fn rabbitmq_definitions_match_the_topology() {
    let defs = definitions();
    let topology = Topology::new("aptix").with_stages(&aptix::stages::names());

    // Queues and their arguments, as Topology::declare declares them.
    let mut expected_queues = BTreeMap::new();
    for stage in aptix::stages::names() {
        let args = if stage == StageName::new("validate") {
            json!({"x-single-active-consumer": true})
        } else {
            json!({})
        };
        expected_queues.insert(topology.stage_queue(stage), args);
    }
    assert_eq!(topology.stage_queue(StageName::new("validate")), topology.requests());
    expected_queues.insert(topology.dead(), json!({}));
    expected_queues.insert(topology.unrouted(), json!({}));
    for tier in RETRY_TIERS_MS {
        expected_queues.insert(
            topology.delay_exchange(tier),
            json!({"x-message-ttl": tier, "x-dead-letter-exchange": ""}),
        );
    }
    let mut queues = BTreeMap::new();
    for q in defs["queues"].as_array().expect("queues") {
        let name = durable_entity(q);
        assert!(q.get("type").is_none_or(|t| t == "classic"), "{name} is a classic queue");
        assert!(queues.insert(name.clone(), q["arguments"].clone()).is_none(), "{name} twice");
    }
    assert_eq!(queues, expected_queues);

    let mut expected_exchanges = BTreeMap::from([
        (topology.replies_exchange(), "direct".to_owned()),
        (topology.requests_exchange(), "topic".to_owned()),
    ]);
    for tier in RETRY_TIERS_MS {
        expected_exchanges.insert(topology.delay_exchange(tier), "fanout".to_owned());
    }
    let mut exchanges = BTreeMap::new();
    for x in defs["exchanges"].as_array().expect("exchanges") {
        let name = durable_entity(x);
        assert_eq!(x["internal"], false, "{name}");
        assert_eq!(x["arguments"], json!({}), "{name}");
        exchanges.insert(name, x["type"].as_str().unwrap().to_owned());
    }
    assert_eq!(exchanges, expected_exchanges);

    // The entry exchange feeds the ingress queue with `#`; each delay exchange feeds its queue of
    // the same name; session queues are bound at run time.
    let binding = |source: String, destination: String, key: &str| {
        json!({"source": source, "vhost": "/", "destination": destination,
               "destination_type": "queue", "routing_key": key, "arguments": {}})
    };
    let mut expected_bindings = BTreeMap::from([(
        topology.requests_exchange(),
        binding(topology.requests_exchange(), topology.requests(), "#"),
    )]);
    for tier in RETRY_TIERS_MS {
        let name = topology.delay_exchange(tier);
        expected_bindings.insert(name.clone(), binding(name.clone(), name, ""));
    }
    let mut bindings = BTreeMap::new();
    for b in defs["bindings"].as_array().expect("bindings") {
        let source = b["source"].as_str().unwrap().to_owned();
        assert!(bindings.insert(source.clone(), b.clone()).is_none(), "two bindings from {source}");
    }
    assert_eq!(bindings, expected_bindings);

    let keys: BTreeSet<&str> = defs.as_object().unwrap().keys().map(String::as_str).collect();
    let expected =
        ["bindings", "exchanges", "permissions", "policies", "queues", "users", "vhosts"];
    assert_eq!(keys, BTreeSet::from(expected));
    assert_eq!(defs["vhosts"], json!([{"name": "/"}]));
}

#[test]
fn rabbitmq_definitions_separate_workers_from_clients() {
    let defs = definitions();
    // Two users, no administration (the workers' user may read queue depths through the
    // management API), and no password: credentials stay out of the repository; setup.sh sets
    // them.
    let users = defs["users"].as_array().expect("users");
    let names: Vec<&str> = users.iter().map(|u| u["name"].as_str().unwrap()).collect();
    assert_eq!(names, [WORKER, CLIENT, MONITOR, CONSOLE]);
    for user in users {
        assert_eq!(user["password_hash"], "", "{user}: no password in the repository");
        assert!(user.get("password").is_none(), "{user}: no password in the repository");
        assert_eq!(user["tags"], expected_tags(user["name"].as_str().unwrap()), "{user}");
    }
    assert_eq!(defs["permissions"], expected_permissions("aptix"));
    assert_eq!(defs["policies"], expected_policies("aptix", "aptix"));
}

/// `setup.sh --print [PREFIX_REGEX]`: the definitions it would import, passwords masked.
fn setup_print(args: &[&str]) -> Json {
    let out = Command::new("bash")
        .arg(root().join(SETUP))
        .arg("--print")
        .args(args)
        .env_remove("APTIX_WORKER_PASSWORD")
        .env_remove("APTIX_CLIENT_PASSWORD")
        .output()
        .expect("running bash");
    assert!(out.status.success(), "setup.sh --print: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("setup.sh --print is not JSON: {e}"))
}

#[test]
fn setup_script_writes_the_shipped_definitions() {
    let defs = definitions();
    let printed = setup_print(&["aptix"]);
    assert_eq!(printed["permissions"], defs["permissions"]);
    assert_eq!(printed["policies"], defs["policies"]);
    let users = printed["users"].as_array().unwrap();
    let names: Vec<&str> = users.iter().map(|u| u["name"].as_str().unwrap()).collect();
    assert_eq!(names, [WORKER, CLIENT, MONITOR, CONSOLE]);
    for user in users {
        assert_eq!(user["password"], "***", "{user}: --print masks passwords");
        assert_eq!(user["tags"], expected_tags(user["name"].as_str().unwrap()), "{user}");
    }

    // Without an argument: every prefix of the local machine (tests, `aptix`, the demo).
    let local = setup_print(&[]);
    assert_eq!(local["permissions"], expected_permissions("[A-Za-z0-9_-]+"));
    assert_eq!(local["policies"], expected_policies("[A-Za-z0-9_-]+", "aptix-any"));
    // An alternation stays inside the anchors.
    let either = setup_print(&["a|b"]);
    assert_eq!(either["permissions"], expected_permissions("(?:a|b)"));
}

#[test]
fn setup_script_reads_passwords_from_files_and_refuses_what_it_cannot_use() {
    let run = |vars: &[(&str, &str)]| {
        let mut cmd = Command::new("bash");
        cmd.arg(root().join(SETUP)).arg("--print").arg("aptix");
        for var in ["APTIX_WORKER_PASSWORD", "APTIX_CLIENT_PASSWORD"] {
            cmd.env_remove(var).env_remove(format!("{var}_FILE"));
        }
        let out = cmd.envs(vars.iter().copied()).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker");
    std::fs::write(&file, "from-a-secret\n").unwrap();
    let file = file.to_str().unwrap();
    assert_eq!(run(&[("APTIX_WORKER_PASSWORD_FILE", file)]), (true, String::new()));
    let (ok, err) = run(&[("APTIX_CLIENT_PASSWORD_FILE", "/nonexistent/aptix-client")]);
    assert!(!ok && err.contains("APTIX_CLIENT_PASSWORD_FILE"), "{err}");
    let (ok, err) = run(&[("APTIX_WORKER_PASSWORD", "tab\there")]);
    assert!(!ok && err.contains("control character"), "{err}");
    let (ok, err) = run(&[("APTIX_WORKER_PASSWORD", "")]);
    assert!(ok, "--print shows no password: {err}");
    // Importing without the passwords, and without --dev, is refused before anything is done.
    let out = Command::new("bash")
        .arg(root().join(SETUP))
        .arg("aptix")
        .env_remove("APTIX_WORKER_PASSWORD")
        .env_remove("APTIX_WORKER_PASSWORD_FILE")
        .env("APTIX_RABBITMQ_NODE", "nobody@nowhere")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--dev"), "{err}");
    // Users are named after the deployment, so two deployments never reset each other's.
    let other = Command::new("bash")
        .arg(root().join(SETUP))
        .args(["--print", "shop"])
        .env("APTIX_DEPLOYMENT", "shop")
        .output()
        .unwrap();
    let printed: Json = serde_json::from_slice(&other.stdout).unwrap();
    let names: Vec<&str> =
        printed["users"].as_array().unwrap().iter().map(|u| u["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["shop-worker", "shop-client", "shop-monitor", "shop-console"]);
}

/// The `key = value` settings of a rabbitmq.conf text.
fn conf_settings(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("not a setting: {l:?}"));
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect()
}

/// The broker's frames are no larger than the workers read clients' messages with: RabbitMQ does
/// not split properties across frames, so a larger `frame_max` lets a client publish a message
/// no worker can read.
#[test]
fn broker_frames_are_the_size_workers_read_clients_messages_with() {
    let conf = conf_settings(&read("deploy/rabbitmq/rabbitmq.conf"));
    let broker: u32 = conf["frame_max"].parse().unwrap();
    assert_eq!(broker, aptix::broker::CLIENT_FRAME_MAX);
}

#[test]
fn broker_message_limit_equals_the_projects() {
    let conf = conf_settings(&read("deploy/rabbitmq/rabbitmq.conf"));
    let broker: u64 = conf["max_message_size"].parse().unwrap();
    // RabbitMQ 4's default, set explicitly so that 3.x (128 MiB by default) refuses the same.
    assert_eq!(broker, 16 * 1024 * 1024);
    let ours =
        defaults()["amqp"]["max_message_bytes"].as_integer().expect("amqp.max_message_bytes");
    assert_eq!(
        broker,
        u64::try_from(ours).unwrap(),
        "rabbitmq.conf and aptix.example.toml disagree"
    );
    // Nobody lowers the project's limit in a shipped environment without the broker's.
    let compose = compose();
    for svc in services(&compose).values() {
        assert!(!compose_env(svc).contains_key("APTIX__AMQP__MAX_MESSAGE_BYTES"));
    }
    assert!(!K8s::load().env().contains_key("APTIX__AMQP__MAX_MESSAGE_BYTES"));
}

/// `(user, password)` of an `amqp://user:password@host...` URL.
fn amqp_credentials(url: &str) -> (String, String) {
    let rest = url.strip_prefix("amqp://").unwrap_or_else(|| panic!("not an amqp:// URL: {url}"));
    let (userinfo, _) = rest.split_once('@').unwrap_or_else(|| panic!("no user in {url}"));
    let (user, password) =
        userinfo.split_once(':').unwrap_or_else(|| panic!("no password in {url}"));
    (user.to_owned(), password.to_owned())
}

/// The plugins of an `enabled_plugins` file, an Erlang list such as `[a,b].`
fn enabled_plugins(text: &str) -> Vec<String> {
    let list = text
        .trim()
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix("]."))
        .unwrap_or_else(|| panic!("enabled_plugins is not an Erlang list `[a,b].`: {text:?}"));
    list.split(',').map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect()
}

/// A compose service's bind mounts and volumes: target path → source.
fn mounts(service: &Yaml) -> BTreeMap<String, String> {
    service["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|v| {
            let parts: Vec<&str> = yaml_str(v, "volume").split(':').collect();
            (parts[1].to_owned(), parts[0].to_owned())
        })
        .collect()
}

#[test]
fn compose_wires_the_broker_configuration_and_the_worker_user() {
    let compose = compose();
    let services = services(&compose);
    let rabbit = &services["rabbitmq"];
    let broker = mounts(rabbit);
    let conf = broker
        .iter()
        .find(|(target, _)| {
            target.starts_with("/etc/rabbitmq/conf.d/") && target.ends_with(".conf")
        })
        .map(|(_, source)| source.as_str());
    assert_eq!(conf, Some("./deploy/rabbitmq/rabbitmq.conf"), "rabbitmq.conf in conf.d");
    assert_eq!(broker["/etc/aptix/definitions.json"], "./deploy/rabbitmq/definitions.json");
    assert_eq!(broker["/etc/aptix/setup.sh"], "./deploy/rabbitmq/setup.sh");
    // The plugins enabled at boot, also when only the broker runs (for `cargo test`): the
    // image's management UI, and the consistent-hash exchange of the ingress partitions.
    let plugins_file = broker
        .get("/etc/rabbitmq/enabled_plugins")
        .expect("deploy/rabbitmq/enabled_plugins mounted as /etc/rabbitmq/enabled_plugins");
    let plugins = enabled_plugins(&read(plugins_file.trim_start_matches("./")));
    for plugin in ["rabbitmq_management", HASH_PLUGIN] {
        assert!(plugins.iter().any(|p| p == plugin), "compose's broker enables {plugin}");
    }

    // The one-shot setup: the broker's image and Erlang cookie (its data volume), the prefix the
    // workers use, once the broker is up.
    let setup = &services["rabbitmq-setup"];
    assert_eq!(setup["image"], rabbit["image"]);
    assert_eq!(scalar(&setup["restart"]), "no");
    let setup_mounts = mounts(setup);
    assert_eq!(setup_mounts["/etc/aptix/setup.sh"], "./deploy/rabbitmq/setup.sh");
    assert_eq!(
        setup_mounts["/var/lib/rabbitmq"], broker["/var/lib/rabbitmq"],
        "the broker's cookie"
    );
    assert_eq!(
        yaml_str(&setup["depends_on"]["rabbitmq"]["condition"], "condition"),
        "service_healthy"
    );
    let setup_env = compose_env(setup);
    let node = format!("rabbit@{}", yaml_str(&rabbit["hostname"], "hostname"));
    assert_eq!(setup_env["APTIX_RABBITMQ_NODE"], node);

    assert_ne!(setup_env["APTIX_WORKER_PASSWORD"], setup_env["APTIX_CLIENT_PASSWORD"]);

    // Every Aptix process that has a broker URL connects as aptix-worker with the password
    // setup.sh sets, under the prefix setup.sh was given; the workers wait for the setup.
    for (name, svc) in services.iter().filter(|(_, svc)| svc.get("build").is_some()) {
        let env = compose_env(svc);
        assert!(env.values().all(|v| !v.contains("guest")), "{name} uses guest");
        let Some(url) = env.get("APTIX__AMQP__URL") else { continue };
        let (user, password) = amqp_credentials(url);
        // The console has a user of its own (dead letters and replays only).
        let (expected, var) = if name == "console" {
            (CONSOLE, "APTIX_CONSOLE_PASSWORD")
        } else {
            (WORKER, "APTIX_WORKER_PASSWORD")
        };
        assert_eq!(user, expected, "{name}");
        assert_eq!(password, setup_env[var], "{name}: the password setup.sh sets");
        let command = string_list(&setup["command"], "command");
        // Compose is a development set-up: setup.sh runs with --dev.
        let prefix = env["APTIX__AMQP__PREFIX"].as_str();
        assert_eq!(command, ["bash", "/etc/aptix/setup.sh", "--dev", prefix]);
    }
    for stage in aptix::stages::names() {
        let svc = &services[stage.as_str()];
        assert!(compose_env(svc).contains_key("APTIX__AMQP__URL"), "{}", stage.as_str());
        assert_eq!(
            yaml_str(&svc["depends_on"]["rabbitmq-setup"]["condition"], "condition"),
            "service_completed_successfully",
            "{} waits for its broker user",
            stage.as_str()
        );
    }
}

#[test]
fn kubernetes_wires_the_broker_configuration_and_the_worker_user() {
    // deploy/rabbitmq's own kustomization makes the ConfigMap the RabbitMQ pods mount.
    let generator = &yaml_docs("deploy/rabbitmq/kustomization.yaml")[0];
    let maps = generator["configMapGenerator"].as_sequence().unwrap();
    assert_eq!(maps.len(), 1);
    assert_eq!(maps[0]["name"].as_str(), Some("aptix-rabbitmq"));
    let files: BTreeSet<String> = string_list(&maps[0]["files"], "files").into_iter().collect();
    assert_eq!(
        files,
        BTreeSet::from(["definitions.json", "rabbitmq.conf", "setup.sh"].map(String::from))
    );
    assert_eq!(generator["generatorOptions"]["disableNameSuffixHash"].as_bool(), Some(true));

    let k8s = K8s::load();
    let cluster = k8s.named("RabbitmqCluster", "rabbitmq");
    let extra = yaml_str(&cluster["spec"]["rabbitmq"]["additionalConfig"], "additionalConfig");
    assert_eq!(conf_settings(extra), conf_settings(&read("deploy/rabbitmq/rabbitmq.conf")));
    let pod = &cluster["spec"]["override"]["statefulSet"]["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_sequence()
        .and_then(|v| v.iter().find(|v| v["configMap"]["name"].as_str() == Some("aptix-rabbitmq")))
        .expect("a volume of the aptix-rabbitmq ConfigMap");
    let container = &pod["containers"][0];
    assert_eq!(container["name"].as_str(), Some("rabbitmq"));
    let mount = container["volumeMounts"]
        .as_sequence()
        .and_then(|m| m.iter().find(|m| m["name"] == volume["name"]))
        .expect("the ConfigMap mounted");
    assert_eq!(mount["mountPath"].as_str(), Some("/etc/aptix"), "where setup.sh is documented");

    // setup.sh in the pod reads the passwords from the files of the mounted users' Secret (they
    // follow its updates, unlike environment variables).
    let users = k8s.named("Secret", "aptix-rabbitmq-users");
    let secret_volume = pod["volumes"]
        .as_sequence()
        .and_then(|v| {
            v.iter().find(|v| v["secret"]["secretName"].as_str() == Some("aptix-rabbitmq-users"))
        })
        .expect("a volume of the aptix-rabbitmq-users Secret");
    let secret_dir = container["volumeMounts"]
        .as_sequence()
        .and_then(|m| m.iter().find(|m| m["name"] == secret_volume["name"]))
        .and_then(|m| m["mountPath"].as_str())
        .expect("the Secret mounted");
    for key in ["APTIX_WORKER_PASSWORD", "APTIX_CLIENT_PASSWORD"] {
        let file_var = format!("{key}_FILE");
        let path = container["env"]
            .as_sequence()
            .and_then(|env| env.iter().find(|e| e["name"].as_str() == Some(&file_var)))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{file_var} in the RabbitMQ container"));
        assert_eq!(path, format!("{secret_dir}/{key}"), "{file_var}");
        assert!(users["stringData"][key].is_string(), "{key} in the Secret template");
    }

    // The workers (and KEDA) connect as aptix-worker with the password setup.sh sets, to the
    // operator's Service.
    let secrets = k8s.named("Secret", "aptix-secrets");
    let url = yaml_str(&secrets["stringData"]["APTIX__AMQP__URL"], "APTIX__AMQP__URL");
    let (user, password) = amqp_credentials(url);
    assert_eq!(user, WORKER);
    assert_eq!(password, scalar(&users["stringData"]["APTIX_WORKER_PASSWORD"]));
    assert_ne!(password, scalar(&users["stringData"]["APTIX_CLIENT_PASSWORD"]));
    let host = url.split_once('@').unwrap().1.split(':').next().unwrap();
    assert_eq!(
        Some(host),
        cluster["metadata"]["name"].as_str(),
        "the URL names the RabbitMQ Service"
    );
    assert!(k8s.env().values().all(|v| !v.contains("guest")), "no Kubernetes setting uses guest");
    // The documented setup command uses the deployment's prefix.
    let prefix = &k8s.env()["APTIX__AMQP__PREFIX"];
    let example = read("deploy/k8s/rabbitmq-cluster.example.yaml");
    assert!(example.contains(&format!("bash /etc/aptix/setup.sh {prefix}")), "setup.sh {prefix}");
}

#[test]
fn kubernetes_broker_replicates_quorum_queues_and_hashes_the_partitions() {
    let k8s = K8s::load();
    let (partitions, queue_type) = layout(&k8s.env());
    let cluster = k8s.named("RabbitmqCluster", "rabbitmq");
    let replicas = cluster["spec"]["replicas"].as_u64().expect("spec.replicas");
    if queue_type == QueueType::Quorum {
        // A quorum queue needs a majority of its replicas: with 3 nodes, one may fail.
        assert_eq!(replicas, 3, "quorum queues on a 3-node RabbitMQ cluster, not {replicas}");
    }
    let rabbitmq = &cluster["spec"]["rabbitmq"];
    let plugins = rabbitmq
        .get("additionalPlugins")
        .map_or_else(Vec::new, |p| string_list(p, "additionalPlugins"));
    if partitions > 1 {
        assert!(
            plugins.iter().any(|p| p == HASH_PLUGIN),
            "{partitions} ingress partitions need {HASH_PLUGIN} in spec.rabbitmq.additionalPlugins"
        );
    }
}
