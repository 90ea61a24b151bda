//! Language tags from file names, as used for `[CONTEXT]` code fences and the `language` payload.

use std::path::Path;

/// The language tag of a file, from its name; `text` when unknown.
pub fn language_for(path: &Path) -> &'static str {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    match name {
        "Dockerfile" | "Containerfile" => return "dockerfile",
        "Makefile" | "GNUmakefile" | "makefile" => return "makefile",
        "CMakeLists.txt" => return "cmake",
        "Pipfile" => return "toml",
        "Gemfile" | "Rakefile" => return "ruby",
        "Jenkinsfile" => return "groovy",
        _ => {}
    }
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "rs" => "rust",
        "cs" | "csx" => "csharp",
        "ts" | "tsx" | "mts" | "cts" => "typescript",
        "js" | "jsx" | "mjs" | "cjs" => "javascript",
        "py" | "pyi" => "python",
        "go" => "go",
        "java" => "java",
        "kt" | "kts" => "kotlin",
        "scala" | "sc" => "scala",
        "c" | "h" => "c",
        "cc" | "cpp" | "cxx" | "hpp" | "hh" | "hxx" | "inl" => "cpp",
        "m" | "mm" => "objectivec",
        "swift" => "swift",
        "rb" => "ruby",
        "php" => "php",
        "lua" => "lua",
        "pl" | "pm" => "perl",
        "r" => "r",
        "dart" => "dart",
        "ex" | "exs" => "elixir",
        "erl" | "hrl" => "erlang",
        "hs" => "haskell",
        "ml" | "mli" => "ocaml",
        "fs" | "fsx" => "fsharp",
        "vb" => "vbnet",
        "sh" | "bash" | "zsh" => "bash",
        "ps1" | "psm1" => "powershell",
        "bat" | "cmd" => "batch",
        "sql" => "sql",
        "proto" => "protobuf",
        "graphql" | "gql" => "graphql",
        "md" | "markdown" => "markdown",
        "rst" => "rst",
        "adoc" => "asciidoc",
        "toml" => "toml",
        "yaml" | "yml" => "yaml",
        "json" | "jsonc" => "json",
        "xml" | "csproj" | "props" | "targets" | "xaml" | "resx" | "config" => "xml",
        "html" | "htm" => "html",
        "css" => "css",
        "scss" | "sass" => "scss",
        "vue" => "vue",
        "svelte" => "svelte",
        "tf" | "hcl" => "hcl",
        "gradle" | "groovy" => "groovy",
        "ini" | "cfg" => "ini",
        _ => "text",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_languages_are_recognised() {
        for (name, lang) in [
            ("src/main.rs", "rust"),
            ("a/B.cs", "csharp"),
            ("ui/Button.tsx", "typescript"),
            ("x.mjs", "javascript"),
            ("pkg/x.py", "python"),
            ("main.go", "go"),
            ("A.java", "java"),
            ("README.md", "markdown"),
            ("Dockerfile", "dockerfile"),
            ("LICENSE", "text"),
            ("weird.RS", "rust"),
        ] {
            assert_eq!(language_for(Path::new(name)), lang, "{name}");
        }
    }
}
