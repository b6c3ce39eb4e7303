// Command subscriber is an example fleetmedic subscriber in Go, standard library only.
//
// It reads remediation commands as kcat's JSON envelope lines on stdin (one record per line:
// {"topic":..,"partition":..,"offset":..,"headers":["name","value",..],"key":..,"payload":".."}),
// a bridge that needs no Kafka client library:
//
//	kcat -C -b BROKER -t fleetmedic.remediation.commands -J -u | \
//	  go run . -schema ../../../deploy/schemas/RemediationCommand.schema.json -key command=/etc/fleetmedic/command.key
//
// For each record it
//  1. verifies the fleetmedic-signature header (sha256=<hex HMAC-SHA256>) over the value bytes
//     exactly as received, with the key that the fleetmedic-key-id header names (-key ID=FILE,
//     repeatable: during a key rotation give both the old and the new key);
//  2. validates the value against the published JSON Schema (the keywords fleetmedic's schemas
//     use: $ref, type, properties, required, additionalProperties, items, enum, const, anyOf,
//     minimum, maximum, minLength, maxLength, pattern; any other keyword is an error);
//  3. refuses an expired command (expires_at before -now, default the clock);
//  4. prints what it would do: "OK <partition>/<offset> would <action> <target> ...", or
//     "REJECTED <partition>/<offset>: <reason>".
//
// It exits 1 if any record was rejected, 2 on a usage error.
package main

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

const (
	signatureHeader = "fleetmedic-signature"
	keyIDHeader     = "fleetmedic-key-id"
	signaturePrefix = "sha256="
)

type keyFlags map[string][]byte

func (k keyFlags) String() string { return fmt.Sprint(len(k), " keys") }

func (k keyFlags) Set(v string) error {
	id, path, ok := strings.Cut(v, "=")
	if !ok || id == "" || path == "" {
		return errors.New("want ID=FILE")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	key := bytes.TrimSpace(raw) // as fleetmedic reads a key file
	if len(key) < 32 {
		return fmt.Errorf("key %s: shorter than 32 bytes", id)
	}
	k[id] = key
	return nil
}

// envelope is one line of `kcat -J`.
type envelope struct {
	Partition int64             `json:"partition"`
	Offset    int64             `json:"offset"`
	Headers   []json.RawMessage `json:"headers"`
	Key       *string           `json:"key"`
	Payload   *string           `json:"payload"`
}

func headersOf(e envelope) (map[string]string, error) {
	if len(e.Headers)%2 != 0 {
		return nil, errors.New("headers: odd number of entries")
	}
	out := map[string]string{}
	for i := 0; i < len(e.Headers); i += 2 {
		var name string
		var value *string
		if err := json.Unmarshal(e.Headers[i], &name); err != nil {
			return nil, fmt.Errorf("header name: %w", err)
		}
		if err := json.Unmarshal(e.Headers[i+1], &value); err != nil {
			return nil, fmt.Errorf("header %s: %w", name, err)
		}
		if value != nil {
			out[name] = *value // the last one wins, as in fleetmedic.signing.header
		}
	}
	return out, nil
}

// verify checks the signature header over value with the key its key id names.
func verify(value []byte, headers map[string]string, keys keyFlags) (string, error) {
	sig, ok := headers[signatureHeader]
	if !ok {
		return "", errors.New("no " + signatureHeader + " header")
	}
	kid, ok := headers[keyIDHeader]
	if !ok {
		return "", errors.New("no " + keyIDHeader + " header")
	}
	key, ok := keys[kid]
	if !ok {
		return "", fmt.Errorf("key id %q is not accepted (retired or unknown)", kid)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(value)
	want := signaturePrefix + hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return "", fmt.Errorf("signature does not match the value bytes (key %s)", kid)
	}
	return kid, nil
}

// --- a JSON Schema subset ---------------------------------------------------------------------

type validator struct{ root map[string]any }

var annotations = map[string]bool{"$id": true, "$schema": true, "$defs": true, "title": true,
	"description": true, "default": true, "examples": true, "format": true}

func (v validator) resolve(ref string) (map[string]any, error) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, fmt.Errorf("$ref %s: only local references are supported", ref)
	}
	var node any = v.root
	for _, part := range strings.Split(ref[2:], "/") {
		m, ok := node.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("$ref %s: not found", ref)
		}
		node = m[strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")]
	}
	s, ok := node.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("$ref %s: not a schema", ref)
	}
	return s, nil
}

func typeOK(want string, x any) bool {
	switch want {
	case "object":
		_, ok := x.(map[string]any)
		return ok
	case "array":
		_, ok := x.([]any)
		return ok
	case "string":
		_, ok := x.(string)
		return ok
	case "boolean":
		_, ok := x.(bool)
		return ok
	case "null":
		return x == nil
	case "number":
		_, ok := x.(float64)
		return ok
	case "integer":
		f, ok := x.(float64)
		return ok && f == math.Trunc(f)
	}
	return false
}

func equal(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

func (v validator) check(s map[string]any, x any, path string) error {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kw := s[k]
		switch k {
		case "$ref":
			target, err := v.resolve(kw.(string))
			if err != nil {
				return err
			}
			if err := v.check(target, x, path); err != nil {
				return err
			}
		case "type":
			types, ok := kw.([]any)
			if !ok {
				types = []any{kw}
			}
			matched := false
			for _, t := range types {
				matched = matched || typeOK(t.(string), x)
			}
			if !matched {
				return fmt.Errorf("%s: not of type %v", path, kw)
			}
		case "enum":
			found := false
			for _, e := range kw.([]any) {
				found = found || equal(e, x)
			}
			if !found {
				return fmt.Errorf("%s: %v is not one of %v", path, x, kw)
			}
		case "const":
			if !equal(kw, x) {
				return fmt.Errorf("%s: must be %v", path, kw)
			}
		case "anyOf":
			var last error
			for _, alt := range kw.([]any) {
				if last = v.check(alt.(map[string]any), x, path); last == nil {
					break
				}
			}
			if last != nil {
				return fmt.Errorf("%s: matches no alternative (%v)", path, last)
			}
		case "required":
			if obj, ok := x.(map[string]any); ok {
				for _, name := range kw.([]any) {
					if _, ok := obj[name.(string)]; !ok {
						return fmt.Errorf("%s: %s is required", path, name)
					}
				}
			}
		case "properties":
			if obj, ok := x.(map[string]any); ok {
				for name, sub := range kw.(map[string]any) {
					if val, ok := obj[name]; ok {
						if err := v.check(sub.(map[string]any), val, path+"."+name); err != nil {
							return err
						}
					}
				}
			}
		case "additionalProperties":
			obj, ok := x.(map[string]any)
			if !ok {
				continue
			}
			props, _ := s["properties"].(map[string]any)
			for name, val := range obj {
				if _, declared := props[name]; declared {
					continue
				}
				switch extra := kw.(type) {
				case bool:
					if !extra {
						return fmt.Errorf("%s: unexpected field %s", path, name)
					}
				case map[string]any:
					if err := v.check(extra, val, path+"."+name); err != nil {
						return err
					}
				}
			}
		case "items":
			if arr, ok := x.([]any); ok {
				for i, item := range arr {
					if err := v.check(kw.(map[string]any), item, fmt.Sprintf("%s[%d]", path, i)); err != nil {
						return err
					}
				}
			}
		case "minimum", "maximum":
			if f, ok := x.(float64); ok {
				bound := kw.(float64)
				if (k == "minimum" && f < bound) || (k == "maximum" && f > bound) {
					return fmt.Errorf("%s: %v is out of range (%s %v)", path, f, k, bound)
				}
			}
		case "minLength", "maxLength":
			if str, ok := x.(string); ok {
				n, bound := utf8.RuneCountInString(str), int(kw.(float64))
				if (k == "minLength" && n < bound) || (k == "maxLength" && n > bound) {
					return fmt.Errorf("%s: length %d violates %s %d", path, n, k, bound)
				}
			}
		case "pattern":
			if str, ok := x.(string); ok {
				re, err := regexp.Compile(kw.(string))
				if err != nil {
					return fmt.Errorf("%s: pattern %s: %v", path, kw, err)
				}
				if !re.MatchString(str) {
					return fmt.Errorf("%s: does not match %s", path, kw)
				}
			}
		default:
			if !annotations[k] {
				return fmt.Errorf("schema keyword %s is not supported by this example: refusing", k)
			}
		}
	}
	return nil
}

func target(cmd map[string]any) string {
	node, _ := cmd["node"].(string)
	job, _ := cmd["job"].(string)
	switch {
	case node != "" && job != "":
		return "node " + node + " (job " + job + ")"
	case node != "":
		return "node " + node
	}
	return "job " + job
}

func main() {
	keys := keyFlags{}
	schemaPath := flag.String("schema", "deploy/schemas/RemediationCommand.schema.json", "the published JSON Schema")
	nowFlag := flag.Float64("now", 0, "the time to check expires_at against (Unix seconds; default: the clock)")
	flag.Var(keys, "key", "ID=FILE: a key the records may be signed with (repeat during a rotation)")
	flag.Parse()
	if len(keys) == 0 {
		fmt.Fprintln(os.Stderr, "usage: subscriber -schema FILE -key ID=FILE [-key ID=FILE ...] < kcat-J-lines")
		os.Exit(2)
	}
	raw, err := os.ReadFile(*schemaPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var root map[string]any
	if err := json.Unmarshal(raw, &root); err != nil {
		fmt.Fprintln(os.Stderr, "schema:", err)
		os.Exit(2)
	}
	schema := validator{root}
	now := *nowFlag
	if now == 0 {
		now = float64(time.Now().UnixNano()) / 1e9
	}

	rejected := 0
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		line := bytes.TrimSpace(in.Bytes())
		if len(line) == 0 {
			continue
		}
		where, cmd, env, err := handle(line, keys, schema, now)
		if err != nil {
			rejected++
			fmt.Printf("REJECTED %s: %s\n", where, err)
			continue
		}
		dry := ""
		if d, _ := cmd["dry_run"].(bool); d {
			dry = " (dry run)"
		}
		fmt.Printf("OK %s key=%s would %v %s%s: %v [command %v, incident %v]\n", where, keyOf(env), cmd["action"],
			target(cmd), dry, cmd["reason"], cmd["id"], cmd["incident_id"])
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "stdin:", err)
		os.Exit(2)
	}
	if rejected > 0 {
		os.Exit(1)
	}
}

// handle checks one envelope line: its signature header over the value bytes, then the schema,
// then the expiry. It returns where the record was (partition/offset) and the command.
func handle(line []byte, keys keyFlags, schema validator, now float64) (string, map[string]any, envelope, error) {
	var env envelope
	if err := json.Unmarshal(line, &env); err != nil {
		return "?", nil, env, fmt.Errorf("not a kcat -J envelope: %w", err)
	}
	where := fmt.Sprintf("%d/%d", env.Partition, env.Offset)
	if env.Payload == nil {
		return where, nil, env, errors.New("no value")
	}
	headers, err := headersOf(env)
	if err != nil {
		return where, nil, env, err
	}
	value := []byte(*env.Payload) // kcat -J prints the value bytes as a JSON string: these are they
	if _, err := verify(value, headers, keys); err != nil {
		return where, nil, env, fmt.Errorf("signature: %w", err)
	}
	var cmd map[string]any
	if err := json.Unmarshal(value, &cmd); err != nil {
		return where, nil, env, fmt.Errorf("value is not JSON: %w", err)
	}
	if err := schema.check(schema.root, cmd, "$"); err != nil {
		return where, nil, env, fmt.Errorf("schema: %w", err)
	}
	if exp, _ := cmd["expires_at"].(float64); now > exp {
		return where, nil, env, fmt.Errorf("command %v expired at %.3f", cmd["id"], exp)
	}
	return where, cmd, env, nil
}

func keyOf(e envelope) string {
	if e.Key == nil {
		return ""
	}
	return *e.Key
}
