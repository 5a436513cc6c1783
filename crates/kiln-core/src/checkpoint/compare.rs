//! Which settings of a run differ from those a checkpoint was saved with.

/// The dotted names of the settings where the TOML values `saved` and `now` differ
/// (`model.d_model`), in name order; empty when they agree.
pub fn config_differences(saved: &toml::Value, now: &toml::Value) -> Vec<String> {
    let mut out = Vec::new();
    walk("", saved, now, &mut out);
    out
}

fn walk(prefix: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    match (a, b) {
        (toml::Value::Table(a), toml::Value::Table(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let name = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => walk(&name, x, y, out),
                    _ => out.push(name),
                }
            }
        }
        _ if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_every_differing_leaf() {
        let a: toml::Value = toml::from_str("lr = 1.0\n[model]\nd = 4\nh = 2\n").unwrap();
        let b: toml::Value = toml::from_str("lr = 1.0\n[model]\nd = 8\nh = 2\nx = 1\n").unwrap();
        assert_eq!(config_differences(&a, &b), ["model.d", "model.x"]);
        assert!(config_differences(&a, &a).is_empty());
    }
}
