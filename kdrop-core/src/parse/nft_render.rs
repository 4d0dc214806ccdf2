//! nftables rule text rendered from `nft -j` JSON, as `nft list ruleset`
//! would write it, near enough to find the rule.
use serde_json::Value;

use super::nft_json::str_of;

pub fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// One expression as `nft list ruleset` would write it, near enough to find
/// the rule (counter values are left out: they change).
pub fn render_expr(e: &Value) -> String {
    let Some((key, body)) = e.as_object().and_then(|o| o.iter().next()) else {
        return e.to_string();
    };
    match key.as_str() {
        "match" => render_match(body),
        "counter" => match body {
            Value::String(name) => format!("counter name {}", quote(name)),
            _ => "counter".into(),
        },
        "accept" | "drop" | "return" | "continue" => key.clone(),
        "jump" | "goto" => format!("{key} {}", str_of(body, "target")),
        "reject" => match body.get("type").and_then(Value::as_str) {
            None => "reject".into(),
            Some(t) => match body.get("expr").and_then(Value::as_str) {
                Some(x) => format!("reject with {t} {x}"),
                None => format!("reject with {t}"),
            },
        },
        "log" => match body.get("prefix").and_then(Value::as_str) {
            Some(p) => format!("log prefix {}", quote(p)),
            None => "log".into(),
        },
        "vmap" => format!(
            "{} vmap {}",
            body.get("key").map_or(String::new(), render_value),
            body.get("data").map_or(String::new(), render_value)
        ),
        "xt" => format!("xt {} {}", str_of(body, "type"), str_of(body, "name")),
        _ if body.is_null() => key.clone(),
        _ => format!("{key} {body}"),
    }
}

pub(super) fn render_match(body: &Value) -> String {
    let op = body.get("op").and_then(Value::as_str).unwrap_or("==");
    let left = body.get("left").map_or(String::new(), render_value);
    let iface = body
        .get("left")
        .and_then(|l| l.get("meta"))
        .is_some_and(|m| str_of(m, "key").contains("if"));
    // `fib ... oif missing` / `exists`: the JSON compares with a boolean.
    let fib = body.get("left").is_some_and(|l| l.get("fib").is_some());
    let right = match body.get("right") {
        Some(Value::Bool(b)) if fib => if *b { "exists" } else { "missing" }.to_string(),
        Some(Value::String(s)) if iface => quote(s),
        Some(r) => render_value(r),
        None => String::new(),
    };
    let binop = body.get("left").is_some_and(|l| l.get("&").is_some());
    match op {
        "==" if binop => format!("{left} == {right}"),
        "==" | "in" => format!("{left} {right}"),
        _ => format!("{left} {op} {right}"),
    }
}

fn render_value(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(render_value).collect::<Vec<_>>().join(","),
        Value::Object(o) => {
            let Some((k, b)) = o.iter().next() else {
                return String::new();
            };
            match k.as_str() {
                "payload" => format!("{} {}", str_of(b, "protocol"), str_of(b, "field")),
                "meta" => {
                    let key = str_of(b, "key");
                    if ["iifname", "oifname", "iif", "oif"].contains(&key) {
                        key.to_string()
                    } else {
                        format!("meta {key}")
                    }
                }
                "ct" => format!("ct {}", str_of(b, "key")),
                "fib" => format!(
                    "fib {} {}",
                    b.get("flags")
                        .map_or(Vec::new(), |f| match f {
                            Value::Array(a) => a.iter().map(render_value).collect(),
                            other => vec![render_value(other)],
                        })
                        .join(" . "),
                    str_of(b, "result")
                ),
                "prefix" => format!(
                    "{}/{}",
                    b.get("addr").map_or(String::new(), render_value),
                    b.get("len").map_or(String::new(), render_value)
                ),
                "range" => match b.as_array().map(Vec::as_slice) {
                    Some([lo, hi]) => format!("{}-{}", render_value(lo), render_value(hi)),
                    _ => b.to_string(),
                },
                "set" => match b {
                    Value::Array(items) => format!(
                        "{{ {} }}",
                        items
                            .iter()
                            .map(render_value)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    other => render_value(other),
                },
                "&" | "|" | "^" => match b.as_array().map(Vec::as_slice) {
                    Some([l, r]) => {
                        let r = match r {
                            Value::Array(fl) => format!(
                                "({})",
                                fl.iter().map(render_value).collect::<Vec<_>>().join("|")
                            ),
                            other => render_value(other),
                        };
                        format!("{} {k} {r}", render_value(l))
                    }
                    _ => b.to_string(),
                },
                "elem" => b.get("val").map_or(String::new(), render_value),
                "concat" => match b.as_array() {
                    Some(items) => items
                        .iter()
                        .map(render_value)
                        .collect::<Vec<_>>()
                        .join(" . "),
                    None => b.to_string(),
                },
                _ => v.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fib_as_nft_writes_it() {
        let m = |j: &str| render_match(&serde_json::from_str(j).unwrap());
        assert_eq!(
            m(
                r#"{"op": "==", "left": {"fib": {"result": "oif", "flags": ["saddr", "iif"]}}, "right": false}"#
            ),
            "fib saddr . iif oif missing"
        );
        assert_eq!(
            m(
                r#"{"op": "==", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": true}"#
            ),
            "fib daddr type exists"
        );
    }
}
