//! `auto`'s renderer: a model's own chat template, the Jinja text its tokenizer ships
//! (`tokenizer.chat_template` in a GGUF, `chat_template` in `tokenizer_config.json`), run the
//! way Hugging Face's `apply_chat_template` and `llama-server --jinja` run it.
//!
//! - **Environment.** `trim_blocks` and `lstrip_blocks` on, as in `transformers`' sandboxed
//!   environment; Python's string and dict methods (`.strip()`, `.startswith()`, `.items()`, …)
//!   through minijinja's pycompat; `raise_exception(message)` fails the render with the
//!   template's message; `strftime_now(format)` gives today's date (UTC); `tojson` writes
//!   Python's `json.dumps` (`", "` and `": "` separators, key order kept, `indent=` honoured),
//!   not minijinja's compact JSON, so tool schemas reach the model as it was trained on them.
//! - **Variables.** `messages` (OpenAI's shape: `role`, `content`, and an assistant's
//!   `tool_calls` as `{type, function: {name, arguments}}` with `arguments` an object),
//!   `add_generation_prompt` (true), `bos_token`, `eos_token`, and `tools` (OpenAI's
//!   `{type: "function", function: {…}}` list) when the request has tools and the template
//!   reads `tools` ([`ChatTemplate::reads_tools`]).
//! - **Bounds.** A template is operator-supplied (it comes with the weights) but renders
//!   client text: rendering is capped at [`FUEL`] instructions, so a template that loops on
//!   its input cannot hold a thread.

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::Serialize;

use super::tools::PythonFormatter;
use hangar_backend::{ChatMessage, Role, ToolDefinition};

/// The most minijinja instructions one render may execute: far above what a long chat needs
/// with any published template (a 100-message chat through Qwen3's template takes well under
/// a million), far below what holds a thread for long.
pub(crate) const FUEL: u64 = 5_000_000;

/// The template's name inside its environment.
const NAME: &str = "chat_template";

/// A compiled chat template plus the special-token texts it may print.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    reads_tools: bool,
}

impl ChatTemplate {
    /// Compiles `source`.
    ///
    /// # Errors
    /// minijinja's syntax error (with its line) when the template cannot be parsed.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_owned())?;
        let reads_tools = env
            .get_template(NAME)
            .map(|t| t.undeclared_variables(false).contains("tools"))
            .unwrap_or(false);
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            reads_tools,
        })
    }

    /// Whether the template reads `tools` (Qwen 2.5/3, Hermes, Llama 3.1 do; SmolLM2 does not):
    /// then tools go to it, else the engine describes them in the system message.
    pub fn reads_tools(&self) -> bool {
        self.reads_tools
    }

    /// Renders `messages` (and `tools`, when non-empty), ending with the generation prompt.
    ///
    /// # Errors
    /// The template's own `raise_exception` message, or minijinja's error (an undefined call,
    /// a type error, running out of [`FUEL`]).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
    ) -> Result<String, Error> {
        let template = self.env.get_template(NAME)?;
        let messages: Vec<TemplateMessage<'_>> =
            messages.iter().map(TemplateMessage::from).collect();
        let tools: Option<Vec<TemplateTool<'_>>> =
            (!tools.is_empty()).then(|| tools.iter().map(TemplateTool::from).collect());
        template.render(context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => true,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
    }
}

/// A message as chat templates read it (OpenAI's shape).
#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'static str,
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<TemplateToolCall<'a>>,
}

impl<'a> From<&'a ChatMessage> for TemplateMessage<'a> {
    fn from(m: &'a ChatMessage) -> Self {
        let tool_calls = m
            .tool_calls
            .iter()
            .map(|call| TemplateToolCall {
                kind: "function",
                function: TemplateFunction {
                    name: &call.name,
                    // Templates index arguments as a mapping (`arguments | tojson`, `.items()`).
                    arguments: serde_json::from_str(&call.arguments)
                        .unwrap_or_else(|_| serde_json::Value::String(call.arguments.clone())),
                },
            })
            .collect();
        Self { role: role_name(m.role), content: &m.content, tool_calls }
    }
}

#[derive(Serialize)]
struct TemplateToolCall<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: TemplateFunction<'a>,
}

#[derive(Serialize)]
struct TemplateFunction<'a> {
    name: &'a str,
    arguments: serde_json::Value,
}

/// A tool as chat templates read it (`{"type": "function", "function": {…}}`).
#[derive(Serialize)]
struct TemplateTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: &'a ToolDefinition,
}

impl<'a> From<&'a ToolDefinition> for TemplateTool<'a> {
    fn from(function: &'a ToolDefinition) -> Self {
        Self { kind: "function", function }
    }
}

fn role_name(role: Role) -> &'static str {
    role.as_str()
}

/// `raise_exception(message)`: the template refuses the chat.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson`, as Python's `json.dumps(value, ensure_ascii=False, indent=indent)` writes it.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let formatter = serde_json::ser::PrettyFormatter::with_indent(&pad);
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))
        }
        None => {
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter))
        }
    };
    written.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    String::from_utf8(out)
        .map(Value::from)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

/// `strftime_now(format)`: today's UTC date and time in `format` (`%d %b %B %Y %m %H %M %S
/// %%`; other directives are printed as written).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

/// `format` for the UTC time `secs` after the Unix epoch.
fn strftime(format: &str, secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (year, month, day) = civil_from_days(secs / 86_400);
    let (hour, minute, second) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The proleptic Gregorian (year, month, day) of `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
#[path = "jinja_tests.rs"]
mod tests;
