//! Checks the hand-written declarations of this crate against `include/peft_c.h`.
//!
//! A small parser reads the header: every `PEFT_API` prototype, every callback typedef, every opaque
//! `typedef struct X X;` and every `#define PEFT_*` constant. C types are mapped to the Rust types
//! this crate must use for them, and the result is compared with the tables the crate's declaration
//! macros record (`FUNCTIONS`, `CALLBACKS`, `OPAQUE_TYPES`, `CONSTANTS`). Anything missing on either
//! side, a different parameter count, a different type or a different value fails the test, listing
//! every difference. A declaration the parser does not understand fails it too, so a new kind of
//! declaration in the header cannot slip through unchecked.

use std::collections::BTreeMap;
use std::path::PathBuf;

use peft_c_sys::{Declaration, CALLBACKS, CONSTANTS, FUNCTIONS, OPAQUE_TYPES, STRUCTS};

fn header_path() -> PathBuf {
    match std::env::var_os("PEFT_C_HEADER") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/peft_c.h"),
    }
}

/// A function or callback signature with Rust type spellings (whitespace removed).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Signature {
    params: Vec<String>,
    ret: String,
}

/// A struct field: a plain value of a Rust type, or a function pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Value { name: String, ty: String },
    Function { name: String, signature: Signature },
}

#[derive(Debug, Default)]
struct Header {
    functions: BTreeMap<String, Signature>,
    callbacks: BTreeMap<String, Signature>,
    opaque_types: Vec<String>,
    constants: BTreeMap<String, i64>,
    /// Structs defined in the header (`typedef struct X { ... } X;`), fields in order.
    structs: BTreeMap<String, Vec<Field>>,
    /// Statements the parser could not classify.
    unknown: Vec<String>,
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        match (block, line) {
            (Some(b), l) if l.map_or(true, |l| b < l) => {
                out.push_str(&rest[..b]);
                let end = rest[b + 2..].find("*/").expect("unterminated comment in the header");
                out.push(' ');
                rest = &rest[b + 2 + end + 2..];
            }
            (_, Some(l)) => {
                out.push_str(&rest[..l]);
                rest = match rest[l..].find('\n') {
                    Some(nl) => &rest[l + nl..],
                    None => "",
                };
            }
            (None, None) => {
                out.push_str(rest);
                return out;
            }
            (Some(_), None) => unreachable!(),
        }
    }
}

fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    word.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            tokens.push(word);
        } else {
            tokens.push(c.to_string());
            chars.next();
        }
    }
    tokens
}

fn is_identifier(token: &str) -> bool {
    token.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
}

/// Evaluates a constant expression: integers, earlier constants, + - * / and parentheses.
struct Evaluator<'a> {
    tokens: Vec<String>,
    pos: usize,
    known: &'a BTreeMap<String, i64>,
}

impl Evaluator<'_> {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.pos).map(String::as_str)
    }
    fn sum(&mut self) -> Result<i64, String> {
        let mut value = self.product()?;
        while let Some(op @ ("+" | "-")) = self.peek() {
            let op = op.to_string();
            self.pos += 1;
            let rhs = self.product()?;
            value = if op == "+" { value + rhs } else { value - rhs };
        }
        Ok(value)
    }
    fn product(&mut self) -> Result<i64, String> {
        let mut value = self.unary()?;
        while let Some(op @ ("*" | "/")) = self.peek() {
            let op = op.to_string();
            self.pos += 1;
            let rhs = self.unary()?;
            value = if op == "*" { value * rhs } else { value / rhs };
        }
        Ok(value)
    }
    fn unary(&mut self) -> Result<i64, String> {
        match self.peek() {
            Some("-") => {
                self.pos += 1;
                Ok(-self.unary()?)
            }
            Some("(") => {
                self.pos += 1;
                let value = self.sum()?;
                if self.peek() != Some(")") {
                    return Err("missing )".into());
                }
                self.pos += 1;
                Ok(value)
            }
            Some(token) => {
                let token = token.to_string();
                self.pos += 1;
                if token.starts_with(|c: char| c.is_ascii_digit()) {
                    let digits = token.trim_end_matches(['u', 'U', 'l', 'L']);
                    let parsed = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
                        Some(hex) => i64::from_str_radix(hex, 16),
                        None => digits.parse(),
                    };
                    parsed.map_err(|e| format!("{token}: {e}"))
                } else {
                    self.known.get(&token).copied().ok_or_else(|| format!("unknown name {token}"))
                }
            }
            None => Err("expression ends early".into()),
        }
    }
}

fn evaluate(expression: &str, known: &BTreeMap<String, i64>) -> Result<i64, String> {
    let mut evaluator = Evaluator { tokens: tokenize(expression), pos: 0, known };
    let value = evaluator.sum()?;
    if evaluator.pos != evaluator.tokens.len() {
        return Err(format!("trailing tokens in {expression:?}"));
    }
    Ok(value)
}

/// Maps a C type (tokens, without a parameter name) to the Rust type this crate uses for it.
fn rust_type(tokens: &[String]) -> Result<String, String> {
    let mut base_const = false;
    let mut base: Option<String> = None;
    let mut index = 0;
    while index < tokens.len() && tokens[index] != "*" {
        match tokens[index].as_str() {
            "const" => base_const = true,
            name if base.is_none() => base = Some(name.to_string()),
            other => return Err(format!("unexpected {other:?} in type {}", tokens.join(" "))),
        }
        index += 1;
    }
    let base = base.ok_or_else(|| format!("no base type in {}", tokens.join(" ")))?;
    // pointee_const[i]: whether what pointer level i points to is const.
    let mut pointee_const = vec![base_const];
    while index < tokens.len() {
        if tokens[index] != "*" {
            return Err(format!("unexpected {:?} in type {}", tokens[index], tokens.join(" ")));
        }
        index += 1;
        let pointer_const = index < tokens.len() && tokens[index] == "const";
        if pointer_const {
            index += 1;
        }
        pointee_const.push(pointer_const);
    }
    let levels = pointee_const.len() - 1;
    let mut rust = match base.as_str() {
        "void" if levels == 0 => return Ok(String::new()),
        "void" => "c_void".to_string(),
        "char" => "c_char".to_string(),
        "int8_t" => "i8".to_string(),
        "uint8_t" => "u8".to_string(),
        "int16_t" => "i16".to_string(),
        "uint16_t" => "u16".to_string(),
        "int32_t" => "i32".to_string(),
        "uint32_t" => "u32".to_string(),
        "int64_t" => "i64".to_string(),
        "uint64_t" => "u64".to_string(),
        "size_t" => "usize".to_string(),
        "double" => "f64".to_string(),
        "float" => "f32".to_string(),
        name if name.starts_with("peft_") => name.to_string(),
        other => return Err(format!("type {other:?} has no ABI-safe Rust mapping")),
    };
    for &is_const in pointee_const.iter().take(levels) {
        rust = format!("{}{}", if is_const { "*const" } else { "*mut" }, rust);
    }
    Ok(rust)
}

/// Splits "T a, U* b" into Rust parameter types, dropping the names.
fn parameter_types(tokens: &[String]) -> Result<Vec<String>, String> {
    if tokens.len() == 1 && tokens[0] == "void" || tokens.is_empty() {
        return Ok(Vec::new());
    }
    tokens
        .split(|t| t == ",")
        .map(|param| {
            let named = param.len() > 1 && is_identifier(&param[param.len() - 1]) && param[param.len() - 1] != "const";
            rust_type(if named { &param[..param.len() - 1] } else { param })
        })
        .collect()
}

/// Splits `RET NAME ( PARAMS )` at the name: returns (return tokens, name, parameter tokens).
fn split_signature(tokens: &[String]) -> Option<(&[String], &str, &[String])> {
    let open = tokens.iter().position(|t| t == "(")?;
    if open == 0 || tokens.last()? != ")" {
        return None;
    }
    Some((&tokens[..open - 1], tokens[open - 1].as_str(), &tokens[open + 1..tokens.len() - 1]))
}

/// Parses one struct field: `T name` or `R (*name)(PARAMS)`.
fn parse_field(tokens: &[String]) -> Result<Field, String> {
    if let Some(open) = tokens.windows(2).position(|w| w[0] == "(" && w[1] == "*") {
        let ok = tokens.len() > open + 4 && tokens[open + 3] == ")" && tokens[open + 4] == "(";
        if !ok || tokens.last().map(String::as_str) != Some(")") {
            return Err(format!("not a function pointer field: {}", tokens.join(" ")));
        }
        let ret = rust_type(&tokens[..open])?;
        let params = parameter_types(&tokens[open + 5..tokens.len() - 1])?;
        return Ok(Field::Function { name: tokens[open + 2].clone(), signature: Signature { params, ret } });
    }
    match tokens.split_last() {
        Some((name, ty)) if is_identifier(name) && !ty.is_empty() => {
            Ok(Field::Value { name: name.clone(), ty: rust_type(ty)? })
        }
        _ => Err(format!("not a field: {}", tokens.join(" "))),
    }
}

/// Removes every `typedef struct X { FIELDS } X;` from `code`, recording its fields in `header`.
fn take_structs(code: &str, header: &mut Header) -> String {
    let mut rest = code;
    let mut out = String::new();
    while let Some(start) = rest.find("typedef struct") {
        let Some(open) = rest[start..].find(['{', ';']).map(|i| start + i) else { break };
        if rest.as_bytes()[open] == b';' {
            out.push_str(&rest[..=open]); // an opaque typedef
            rest = &rest[open + 1..];
            continue;
        }
        let Some(close) = rest[open..].find('}').map(|i| open + i) else { break };
        let Some(end) = rest[close..].find(';').map(|i| close + i) else { break };
        out.push_str(&rest[..start]);
        let head = tokenize(&rest[start..open]);
        let tail = tokenize(&rest[close + 1..end]);
        let name = head.get(2).cloned().unwrap_or_default();
        if head.len() != 3 || tail != [name.clone()] {
            header.unknown.push(format!("struct {}", head.join(" ")));
        }
        let mut fields = Vec::new();
        for field in rest[open + 1..close].split(';') {
            let tokens = tokenize(field);
            if tokens.is_empty() {
                continue;
            }
            match parse_field(&tokens) {
                Ok(f) => fields.push(f),
                Err(e) => header.unknown.push(format!("struct {name}: {e}")),
            }
        }
        header.structs.insert(name, fields);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn parse_header(text: &str) -> Header {
    let mut header = Header::default();
    let text = strip_comments(text);
    let mut code = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(directive) = trimmed.strip_prefix('#') {
            let words = tokenize(directive);
            if words.first().map(String::as_str) == Some("define") && words.len() > 2 {
                let name = &words[1];
                if name.starts_with("PEFT_") && name != "PEFT_API" {
                    let value = directive.trim_start().trim_start_matches("define").trim_start()[name.len()..].trim();
                    match evaluate(value, &header.constants) {
                        Ok(v) => {
                            header.constants.insert(name.clone(), v);
                        }
                        Err(e) => header.unknown.push(format!("#define {name} {value}: {e}")),
                    }
                }
            }
            continue; // other directives (guards, #ifdef __cplusplus, PEFT_API) are not declarations
        }
        code.push_str(line);
        code.push('\n');
    }
    let code = code.replace("extern \"C\" {", " ");
    let code = take_structs(&code, &mut header);
    for statement in code.split(';') {
        let tokens: Vec<String> = tokenize(statement).into_iter().skip_while(|t| t == "}").collect();
        if tokens.is_empty() {
            continue;
        }
        let text = tokens.join(" ");
        if tokens[0] == "PEFT_API" {
            match split_signature(&tokens[1..]) {
                Some((ret, name, params)) => match (rust_type(ret), parameter_types(params)) {
                    (Ok(ret), Ok(params)) => {
                        header.functions.insert(name.to_string(), Signature { params, ret });
                    }
                    (Err(e), _) | (_, Err(e)) => header.unknown.push(format!("{text}: {e}")),
                },
                None => header.unknown.push(text),
            }
        } else if tokens.len() == 4 && tokens[0] == "typedef" && tokens[1] == "struct" && tokens[2] == tokens[3] {
            header.opaque_types.push(tokens[2].clone());
        } else if tokens[0] == "typedef" && tokens.windows(2).any(|w| w[0] == "(" && w[1] == "*") {
            // typedef RET (*NAME)(PARAMS)
            let open = tokens.iter().position(|t| t == "(").unwrap();
            let ok = tokens.len() > open + 4 && tokens[open + 3] == ")" && tokens[open + 4] == "(";
            if !ok || tokens.last().map(String::as_str) != Some(")") {
                header.unknown.push(text);
                continue;
            }
            let name = tokens[open + 2].clone();
            match (rust_type(&tokens[1..open]), parameter_types(&tokens[open + 5..tokens.len() - 1])) {
                (Ok(ret), Ok(params)) => {
                    header.callbacks.insert(name, Signature { params, ret });
                }
                (Err(e), _) | (_, Err(e)) => header.unknown.push(format!("{text}: {e}")),
            }
        } else {
            header.unknown.push(text);
        }
    }
    header
}

fn signature_of(decl: &Declaration) -> Signature {
    let clean = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    Signature { params: decl.params.iter().map(|p| clean(p)).collect(), ret: clean(decl.ret) }
}

fn compare(kind: &str, header: &BTreeMap<String, Signature>, crate_decls: &[Declaration], problems: &mut Vec<String>) {
    let mut declared = BTreeMap::new();
    for decl in crate_decls {
        if declared.insert(decl.name.to_string(), signature_of(decl)).is_some() {
            problems.push(format!("{kind} {} is declared twice in peft-c-sys", decl.name));
        }
    }
    for (name, want) in header {
        match declared.get(name) {
            None => problems.push(format!("{kind} {name} is in the header but not in peft-c-sys")),
            Some(got) if got.params.len() != want.params.len() => problems.push(format!(
                "{kind} {name}: {} parameters in peft-c-sys, {} in the header",
                got.params.len(),
                want.params.len()
            )),
            Some(got) if got != want => problems.push(format!(
                "{kind} {name}: peft-c-sys has ({}) -> {:?}, the header means ({}) -> {:?}",
                got.params.join(", "),
                got.ret,
                want.params.join(", "),
                want.ret
            )),
            Some(_) => {}
        }
    }
    for name in declared.keys().filter(|name| !header.contains_key(*name)) {
        problems.push(format!("{kind} {name} is in peft-c-sys but not in the header"));
    }
}

fn crate_field(field: &peft_c_sys::Field) -> Field {
    match field {
        peft_c_sys::Field::Value { name, ty } => {
            Field::Value { name: name.to_string(), ty: ty.chars().filter(|c| !c.is_whitespace()).collect() }
        }
        peft_c_sys::Field::Function(decl) => {
            Field::Function { name: decl.name.to_string(), signature: signature_of(decl) }
        }
    }
}

/// Structs: the same fields in the same order (the layout is the ABI). Function pointer fields of
/// the header must also have the signature of the function they stand for (`peft_<field>`).
fn compare_structs(header: &Header, problems: &mut Vec<String>) {
    let declared: BTreeMap<String, Vec<Field>> =
        STRUCTS.iter().map(|(name, fields)| (name.to_string(), fields.iter().map(crate_field).collect())).collect();
    for (name, want) in &header.structs {
        let Some(got) = declared.get(name) else {
            problems.push(format!("struct {name} is in the header but not in peft-c-sys"));
            continue;
        };
        if got.len() != want.len() {
            problems.push(format!("struct {name}: {} fields in peft-c-sys, {} in the header", got.len(), want.len()));
        }
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            if g != w {
                problems.push(format!("struct {name} field {i}: peft-c-sys has {g:?}, the header {w:?}"));
            }
        }
        for field in want {
            if let Field::Function { name: field_name, signature } = field {
                let function = format!("peft_{field_name}");
                if header.functions.get(&function) != Some(signature) {
                    problems.push(format!("struct {name} field {field_name} is not the signature of {function}"));
                }
            }
        }
    }
    for name in declared.keys().filter(|n| !header.structs.contains_key(*n)) {
        problems.push(format!("struct {name} is in peft-c-sys but not in the header"));
    }
}

fn parsed_header() -> Header {
    let path = header_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    parse_header(&text)
}

#[test]
fn declarations_match_the_header() {
    let header = parsed_header();
    // The parser must have found the API, or the comparison below would prove nothing.
    assert!(header.functions.len() >= 140, "only {} prototypes parsed", header.functions.len());
    assert!(header.constants.len() >= 60, "only {} constants parsed", header.constants.len());

    let mut problems: Vec<String> = header.unknown.iter().map(|s| format!("not understood: {s}")).collect();
    compare("function", &header.functions, FUNCTIONS, &mut problems);
    compare("callback", &header.callbacks, CALLBACKS, &mut problems);

    let mut opaque_header = header.opaque_types.clone();
    let mut opaque_crate: Vec<String> = OPAQUE_TYPES.iter().map(|s| s.to_string()).collect();
    opaque_header.sort();
    opaque_crate.sort();
    if opaque_header != opaque_crate {
        problems.push(format!("opaque types: header {opaque_header:?}, peft-c-sys {opaque_crate:?}"));
    }

    compare_structs(&header, &mut problems);

    let crate_constants: BTreeMap<String, i64> = CONSTANTS.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    for (name, value) in &header.constants {
        match crate_constants.get(name) {
            None => problems.push(format!("constant {name} = {value} is in the header but not in peft-c-sys")),
            Some(got) if got != value => problems.push(format!("constant {name}: peft-c-sys {got}, header {value}")),
            Some(_) => {}
        }
    }
    for name in crate_constants.keys().filter(|n| !header.constants.contains_key(*n)) {
        problems.push(format!("constant {name} is in peft-c-sys but not in the header"));
    }
    assert!(problems.is_empty(), "{} difference(s):\n  {}", problems.len(), problems.join("\n  "));
}

#[test]
fn every_function_links() {
    for (name, address) in peft_c_sys::function_addresses() {
        assert_ne!(address, 0, "{name} did not resolve");
    }
}

#[test]
fn library_matches_the_declared_version() {
    // SAFETY: both functions take no arguments and return plain integers.
    let (abi, number) = unsafe { (peft_c_sys::peft_abi_version(), peft_c_sys::peft_version_number()) };
    assert_eq!(abi, peft_c_sys::PEFT_ABI_VERSION);
    assert_eq!(number, peft_c_sys::PEFT_VERSION_NUMBER);
}

/// The table of the running library: its ABI, a size covering every entry declared here, and each
/// entry pointing at the exported function of the same name.
#[test]
fn api_table_points_at_the_exported_functions() {
    // SAFETY: takes any integer; returns NULL or a static table.
    let table = unsafe { peft_c_sys::peft_get_api(peft_c_sys::PEFT_ABI_VERSION) };
    assert!(!table.is_null(), "no table for ABI {}", peft_c_sys::PEFT_ABI_VERSION);
    // SAFETY: a static table at least as large as the library's sizeof(peft_api), checked below
    // before any entry is read.
    let table = unsafe { &*table };
    assert_eq!(table.abi, peft_c_sys::PEFT_ABI_VERSION);
    assert!(table.size as usize >= std::mem::size_of::<peft_c_sys::peft_api>(), "table of {} bytes", table.size);
    let mut entries = 0;
    peft_c_sys::visit_api_entries(table, |name, in_table, exported| {
        assert_eq!(in_table, exported, "entry {name} does not point at peft_{name}");
        entries += 1;
    });
    assert_eq!(entries, FUNCTIONS.len() - 1, "every function but peft_get_api has an entry");
    // SAFETY: as above.
    assert!(unsafe { peft_c_sys::peft_get_api(peft_c_sys::PEFT_ABI_VERSION + 1000) }.is_null());
}

// The checker itself must be able to fail: mismatches that it has to notice.
#[test]
fn checker_notices_differences() {
    let sample = r#"
        #define PEFT_A 3 /* a */
        #define PEFT_B (PEFT_A * 10 + 1)
        #define PEFT_C (-1)
        typedef struct peft_thing peft_thing;
        typedef int32_t (*peft_cb)(void* user, const uint64_t* values);
        PEFT_API peft_error* peft_f(const peft_thing* const* things, size_t n, char** out, const void** view);
        PEFT_API void peft_g(void);
        struct oddity { int x; };
        typedef struct peft_table {
          uint32_t size;
          const char* (*name)(void);
          peft_error* (*open)(const char* path, peft_thing** out);
        } peft_table;
    "#;
    let header = parse_header(sample);
    assert_eq!(header.constants.get("PEFT_B"), Some(&31));
    assert_eq!(header.constants.get("PEFT_C"), Some(&-1));
    assert_eq!(header.opaque_types, ["peft_thing"]);
    assert_eq!(
        header.functions["peft_f"],
        Signature {
            params: vec![
                "*const*constpeft_thing".into(),
                "usize".into(),
                "*mut*mutc_char".into(),
                "*mut*constc_void".into()
            ],
            ret: "*mutpeft_error".into()
        }
    );
    assert_eq!(header.functions["peft_g"], Signature { params: vec![], ret: String::new() });
    assert_eq!(header.callbacks["peft_cb"].params, ["*mutc_void", "*constu64"]);
    assert_eq!(header.unknown.len(), 1, "{:?}", header.unknown);
    assert_eq!(
        header.structs["peft_table"],
        [
            Field::Value { name: "size".into(), ty: "u32".into() },
            Field::Function {
                name: "name".into(),
                signature: Signature { params: vec![], ret: "*constc_char".into() }
            },
            Field::Function {
                name: "open".into(),
                signature: Signature {
                    params: vec!["*constc_char".into(), "*mut*mutpeft_thing".into()],
                    ret: "*mutpeft_error".into()
                }
            },
        ]
    );

    let wrong = [
        Declaration {
            name: "peft_f",
            params: &["*const *const peft_thing", "u64", "*mut *mut c_char", "*mut *const c_void"],
            ret: "*mut peft_error",
        },
        Declaration { name: "peft_extra", params: &[], ret: "" },
    ];
    let mut problems = Vec::new();
    compare("function", &header.functions, &wrong, &mut problems);
    assert_eq!(problems.len(), 3, "{problems:#?}"); // peft_f's type, peft_g missing, peft_extra extra
}
