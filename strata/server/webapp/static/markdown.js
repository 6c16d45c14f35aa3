// A small Markdown renderer that builds DOM nodes and never parses HTML: every piece of
// text goes through textContent / createTextNode, so model output such as
// `<img src=x onerror=...>` or `<script>` is shown as the characters it is.
// Supported: fenced code blocks (```lang), inline `code`, **bold**, *italic*, # headings,
// - / * / 1. lists, > quotes, paragraphs. Links stay text (no URL ever becomes an href).

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Inline spans: `code`, **bold**, *italic* / _italic_, appended to `parent` as nodes.
export function renderInline(text, parent) {
  const pattern = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|\b_([^_]+)_\b/g;
  let last = 0;
  let m;
  while ((m = pattern.exec(text)) !== null) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    if (m[2] !== undefined) parent.appendChild(el("code", null, m[2]));
    else if (m[3] !== undefined) renderInline(m[3], parent.appendChild(el("strong")));
    else parent.appendChild(el("em", null, m[4] !== undefined ? m[4] : m[5]));
    last = pattern.lastIndex;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

function codeBlock(lang, lines) {
  const pre = el("pre", "code");
  if (lang) pre.appendChild(el("span", "lang", lang));
  pre.appendChild(el("code", null, lines.join("\n")));
  return pre;
}

// Replaces the children of `container` with the rendering of `text` (called again on every
// streamed delta; an unclosed fence renders as a code block so far).
export function renderMarkdown(text, container) {
  container.replaceChildren();
  const lines = text.split("\n");
  let i = 0;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) {
      const p = el("p");
      paragraph.forEach((line, k) => {
        if (k) p.appendChild(el("br"));
        renderInline(line, p);
      });
      container.appendChild(p);
      paragraph = [];
    }
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/);
    if (fence) {
      flush();
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1;  // the closing fence (or past the end)
      container.appendChild(codeBlock(fence[2], body));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (heading) {
      flush();
      renderInline(heading[2], container.appendChild(el("h" + Math.min(6, heading[1].length + 2))));
    } else if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      let list = container.lastElementChild;
      if (!list || list.tagName !== (ordered ? "OL" : "UL")) list = container.appendChild(el(ordered ? "ol" : "ul"));
      renderInline(item[2], list.appendChild(el("li")));
    } else if (line.startsWith(">")) {
      flush();
      renderInline(line.replace(/^>\s?/, ""), container.appendChild(el("blockquote")));
    } else if (!line.trim()) {
      flush();
    } else {
      paragraph.push(line);
    }
    i += 1;
  }
  flush();
}
