// An example fleetmedic subscriber in Node.js, standard library only (Node 18+).
//
// It reads remediation commands as kcat's JSON envelope lines on stdin (one record per line:
// {"topic":..,"partition":..,"offset":..,"headers":["name","value",..],"key":..,"payload":".."}),
// a bridge that needs no Kafka client library:
//
//   kcat -C -b BROKER -t fleetmedic.remediation.commands -J -u | \
//     node subscriber.mjs --schema deploy/schemas/RemediationCommand.schema.json --key command=/etc/fleetmedic/command.key
//
// For each record it
//  1. verifies the fleetmedic-signature header (sha256=<hex HMAC-SHA256>) over the value bytes
//     exactly as received, with the key that the fleetmedic-key-id header names (--key ID=FILE,
//     repeatable: during a key rotation give both the old and the new key);
//  2. validates the value against the published JSON Schema (the keywords fleetmedic's schemas
//     use: $ref, type, properties, required, additionalProperties, items, enum, const, anyOf,
//     minimum, maximum, minLength, maxLength, pattern; any other keyword is an error);
//  3. refuses an expired command (expires_at before --now, default the clock);
//  4. prints what it would do: "OK <partition>/<offset> would <action> <target> ...", or
//     "REJECTED <partition>/<offset>: <reason>".
// It exits 1 if any record was rejected, 2 on a usage error.
import { createHmac, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

const SIGNATURE_HEADER = "fleetmedic-signature";
const KEY_ID_HEADER = "fleetmedic-key-id";
const PREFIX = "sha256=";

function usage(why) {
  console.error(`${why}\nusage: node subscriber.mjs --schema FILE --key ID=FILE [--key ID=FILE ...] [--now SECONDS] < kcat-J-lines`);
  process.exit(2);
}

let args;
try {
  args = parseArgs({
    options: {
      schema: { type: "string", default: "deploy/schemas/RemediationCommand.schema.json" },
      key: { type: "string", multiple: true, default: [] },
      now: { type: "string" },
    },
  }).values;
} catch (err) {
  usage(err.message);
}
const keys = new Map();
for (const spec of args.key) {
  const at = spec.indexOf("=");
  if (at < 1) usage(`--key ${spec}: want ID=FILE`);
  const key = Buffer.from(readFileSync(spec.slice(at + 1), "utf8").trim(), "utf8"); // as fleetmedic reads a key file
  if (key.length < 32) usage(`key ${spec.slice(0, at)}: shorter than 32 bytes`);
  keys.set(spec.slice(0, at), key);
}
if (!keys.size) usage("no --key given");
const root = JSON.parse(readFileSync(args.schema, "utf8"));
const now = args.now !== undefined ? Number(args.now) : Date.now() / 1000;

// kcat -J headers: a flat array, name, value, name, value (the last one of a name wins)
function headersOf(env) {
  const list = env.headers ?? [];
  if (!Array.isArray(list) || list.length % 2) throw new Error("headers: not name/value pairs");
  const out = new Map();
  for (let i = 0; i < list.length; i += 2) if (list[i + 1] !== null) out.set(list[i], list[i + 1]);
  return out;
}

function verify(value, headers) {
  const sig = headers.get(SIGNATURE_HEADER);
  const kid = headers.get(KEY_ID_HEADER);
  if (sig === undefined) throw new Error(`no ${SIGNATURE_HEADER} header`);
  if (kid === undefined) throw new Error(`no ${KEY_ID_HEADER} header`);
  const key = keys.get(kid);
  if (!key) throw new Error(`key id ${JSON.stringify(kid)} is not accepted (retired or unknown)`);
  const want = Buffer.from(PREFIX + createHmac("sha256", key).update(value).digest("hex"));
  const got = Buffer.from(sig);
  if (got.length !== want.length || !timingSafeEqual(got, want)) {
    throw new Error(`signature does not match the value bytes (key ${kid})`);
  }
  return kid;
}

// --- a JSON Schema subset ---------------------------------------------------------------------
const ANNOTATIONS = new Set(["$id", "$schema", "$defs", "title", "description", "default", "examples", "format"]);
const isObject = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
const TYPES = {
  object: isObject,
  array: Array.isArray,
  string: (x) => typeof x === "string",
  boolean: (x) => typeof x === "boolean",
  null: (x) => x === null,
  number: (x) => typeof x === "number",
  integer: (x) => Number.isInteger(x),
};
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

function resolve(ref) {
  if (!ref.startsWith("#/")) throw new Error(`$ref ${ref}: only local references are supported`);
  let node = root;
  for (const part of ref.slice(2).split("/")) node = node?.[part.replaceAll("~1", "/").replaceAll("~0", "~")];
  if (!isObject(node)) throw new Error(`$ref ${ref}: not found`);
  return node;
}

function check(s, x, path) {
  for (const [k, kw] of Object.entries(s).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    switch (k) {
      case "$ref":
        check(resolve(kw), x, path);
        break;
      case "type":
        if (![kw].flat().some((t) => TYPES[t]?.(x))) throw new Error(`${path}: not of type ${kw}`);
        break;
      case "enum":
        if (!kw.some((e) => same(e, x))) throw new Error(`${path}: ${JSON.stringify(x)} is not one of ${JSON.stringify(kw)}`);
        break;
      case "const":
        if (!same(kw, x)) throw new Error(`${path}: must be ${JSON.stringify(kw)}`);
        break;
      case "anyOf": {
        const errors = [];
        if (!kw.some((alt) => { try { check(alt, x, path); return true; } catch (e) { errors.push(e.message); return false; } })) {
          throw new Error(`${path}: matches no alternative (${errors.at(-1)})`);
        }
        break;
      }
      case "required":
        if (isObject(x)) for (const name of kw) if (!(name in x)) throw new Error(`${path}: ${name} is required`);
        break;
      case "properties":
        if (isObject(x)) for (const [name, sub] of Object.entries(kw)) if (name in x) check(sub, x[name], `${path}.${name}`);
        break;
      case "additionalProperties":
        if (!isObject(x)) break;
        for (const [name, val] of Object.entries(x)) {
          if (s.properties && name in s.properties) continue;
          if (kw === false) throw new Error(`${path}: unexpected field ${name}`);
          if (isObject(kw)) check(kw, val, `${path}.${name}`);
        }
        break;
      case "items":
        if (Array.isArray(x)) x.forEach((item, i) => check(kw, item, `${path}[${i}]`));
        break;
      case "minimum":
      case "maximum":
        if (typeof x === "number" && (k === "minimum" ? x < kw : x > kw)) throw new Error(`${path}: ${x} is out of range (${k} ${kw})`);
        break;
      case "minLength":
      case "maxLength":
        if (typeof x === "string") {
          const n = [...x].length; // code points, as JSON Schema counts
          if (k === "minLength" ? n < kw : n > kw) throw new Error(`${path}: length ${n} violates ${k} ${kw}`);
        }
        break;
      case "pattern":
        if (typeof x === "string" && !new RegExp(kw, "u").test(x)) throw new Error(`${path}: does not match ${kw}`);
        break;
      default:
        if (!ANNOTATIONS.has(k)) throw new Error(`schema keyword ${k} is not supported by this example: refusing`);
    }
  }
}

function handle(line) {
  let env;
  try {
    env = JSON.parse(line);
  } catch (err) {
    return { where: "?", error: `not a kcat -J envelope: ${err.message}` };
  }
  const where = `${env.partition}/${env.offset}`;
  try {
    if (typeof env.payload !== "string") throw new Error("no value");
    const value = Buffer.from(env.payload, "utf8"); // kcat -J prints the value bytes as a JSON string: these are they
    try {
      verify(value, headersOf(env));
    } catch (err) {
      throw new Error(`signature: ${err.message}`);
    }
    const cmd = JSON.parse(value.toString("utf8"));
    try {
      check(root, cmd, "$");
    } catch (err) {
      throw new Error(`schema: ${err.message}`);
    }
    if (now > cmd.expires_at) throw new Error(`command ${cmd.id} expired at ${cmd.expires_at.toFixed(3)}`);
    return { where, env, cmd };
  } catch (err) {
    return { where, error: err.message };
  }
}

let rejected = 0;
for await (const raw of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  const line = raw.trim();
  if (!line) continue;
  const { where, env, cmd, error } = handle(line);
  if (error) {
    rejected++;
    console.log(`REJECTED ${where}: ${error}`);
    continue;
  }
  const target = cmd.node ? `node ${cmd.node}${cmd.job ? ` (job ${cmd.job})` : ""}` : `job ${cmd.job}`;
  console.log(`OK ${where} key=${env.key ?? ""} would ${cmd.action} ${target}${cmd.dry_run ? " (dry run)" : ""}: ` +
    `${cmd.reason} [command ${cmd.id}, incident ${cmd.incident_id}]`);
}
process.exitCode = rejected ? 1 : 0;
