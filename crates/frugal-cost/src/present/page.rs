//! HTML: escaping, and the self-contained page (inline CSS, no scripts, no network) that
//! the report, the plan and the evaluation pages are written into, in one style.

/// Text safe in HTML content and in quoted attribute values alike.
pub fn esc(text: &str) -> String {
    let amp = text.replace('&', "&amp;");
    let tags = amp.replace('<', "&lt;").replace('>', "&gt;");
    tags.replace('"', "&quot;").replace('\'', "&#39;")
}

/// The style of every frugal page: a centred column on a soft background, white cards
/// (tiles, sections), tables with right-aligned number columns, captioned figures.
pub const STYLE: &str = "
:root{--ink:#1f2933;--soft:#5f6b7a;--line:#e4e7eb} *{box-sizing:border-box}
body{margin:0;background:#f5f7fa;color:var(--ink);font:14px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif}
main{max-width:1080px;margin:0 auto;padding:32px 24px 48px} h1{margin:0;font-size:26px;letter-spacing:-.01em}
h2{font-size:17px;margin:0 0 4px} .meta,.note,footer{color:var(--soft)} .meta{margin:4px 0 0} .note{margin:0 0 10px;font-size:13px}
code{font:.92em ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#eef1f4;padding:1px 5px;border-radius:4px}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(220px,1fr));gap:14px;margin:24px 0 0}
.tile,.dominant,section,.empty{background:#fff;border:1px solid var(--line);border-radius:10px} .tile{padding:14px 18px}
.tile .s{color:var(--soft);font-size:13px} .tile .k{color:var(--soft);font-size:12px;text-transform:uppercase;letter-spacing:.06em}
.tile .v{font-size:28px;font-weight:650;margin:2px 0;font-variant-numeric:tabular-nums}
.dominant{border-left:4px solid #4e79a7;padding:12px 18px;margin:14px 0 0} section{padding:18px 22px;margin:18px 0}
.empty{padding:28px;margin:24px 0;font-size:16px} svg{display:block;width:100%;height:auto} svg text{font-size:12px;fill:#3e4c59}
svg .lbl{font-size:13px;fill:var(--ink)} svg .sub{font-size:11px;fill:var(--soft)} svg .in{fill:#fff;font-weight:600}
svg .grid{stroke:var(--line)} svg .axis{stroke:#9aa5b1} .legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:8px 0 0;font-size:13px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:6px;vertical-align:-1px} .scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;margin-top:14px;font-size:13px}
th,td{padding:6px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{color:var(--soft);font-weight:600;font-size:12px;white-space:nowrap;border-bottom-color:#cbd2d9}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap} tr:last-child td{border-bottom:0} td:first-child{white-space:nowrap}
footer{font-size:12px;margin-top:24px} figure{margin:18px 0} figcaption{color:var(--soft);font-size:13px}
";

/// A whole frugal page: `body` (HTML as it is) in the centred column, in `STYLE`.
pub fn styled(title: &str, body: &str) -> String {
    document(title, STYLE, &format!("<main>\n{body}</main>\n"))
}

/// A whole page: `title` is escaped here, `style` is CSS and `body` HTML as they are.
pub fn document(title: &str, style: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + style.len() + 512);
    out.push_str("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str(&format!("<title>{}</title>\n<style>", esc(title)));
    out.push_str(style);
    out.push_str("</style>\n</head>\n<body>\n");
    out.push_str(body);
    out.push_str("</body>\n</html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_content_and_attributes() {
        assert_eq!(esc("<a b='x'>&\""), "&lt;a b=&#39;x&#39;&gt;&amp;&quot;");
        let page = document("a < b", "p{}", "<p>hi</p>\n");
        assert!(page.starts_with("<!doctype html>") && page.ends_with("</html>\n"));
        assert!(
            page.contains("<title>a &lt; b</title>") && page.contains("<body>\n<p>hi</p>\n</body>")
        );
    }
}
