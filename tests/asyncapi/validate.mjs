// Validates an AsyncAPI document with the official parser (@asyncapi/parser, pinned in
// package-lock.json): exits 0 when it parses with no error-severity diagnostics, 1 otherwise.
//   node validate.mjs deploy/asyncapi.yaml
// The packages are looked up in $FLEETMEDIC_NODE_MODULES (where the tests run `npm ci`, outside the
// repository), else in ./node_modules next to this script.
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const modules = process.env.FLEETMEDIC_NODE_MODULES || join(here, "node_modules");
const require = createRequire(join(modules, "noop.js"));
const { Parser, fromFile, DiagnosticSeverity } = require("@asyncapi/parser");

const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs ASYNCAPI_FILE");
  process.exit(2);
}
const parser = new Parser();
const { document, diagnostics } = await fromFile(parser, resolve(file)).parse();
const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
for (const d of diagnostics) {
  const where = (d.path || []).join(".");
  const sev = ["error", "warning", "info", "hint"][d.severity] ?? d.severity;
  console.log(`${sev}: ${d.code}: ${d.message}${where ? ` at ${where}` : ""}`);
}
if (!document || errors.length) {
  console.error(`${file}: invalid (${errors.length} error(s))`);
  process.exit(1);
}
console.log(`${file}: valid AsyncAPI ${document.version()}: ${document.channels().length} channels, ` +
  `${document.operations().length} operations, ${document.messages().length} messages`);
