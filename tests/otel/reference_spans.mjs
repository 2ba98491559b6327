#!/usr/bin/env node
// The reference sender of the differential trace tests: spans described in a
// JSON document, built by the OpenTelemetry JS SDK (@opentelemetry/
// sdk-trace-base's BasicTracerProvider) and exported by its OTLP/HTTP
// protobuf exporter (@opentelemetry/exporter-trace-otlp-proto) in one
// request.
//
//   node tests/otel/reference_spans.mjs DOC.json URL [--compression gzip]
//        [--header NAME=VALUE]... [--timeout-ms N]
//
// URL is the whole endpoint (http://127.0.0.1:PORT/v1/traces). Prints
// "exported N spans" and exits 0 once the receiver answered 2xx; exits 1
// with the exporter's error otherwise, 2 on a bad document or flag.
//
// The document (attribute maps in the receiver's normalized form, so that a
// test compares input and output directly):
//
//   {"resource_attributes": {KEY: {"type": T, "value": V}, ...},
//    "scope": {"name": "tokenmeterd", "version": "1.2.0"},
//    "spans": [{"trace_id": 32 hex, "span_id": 16 hex,
//               "parent_span_id": 16 hex or "" (a root),
//               "parent_is_remote": bool (default: true when the parent is
//                                         not one of the document's spans),
//               "name": "...", "kind": 1..5 (OTLP's SpanKind numbers),
//               "start_unix_nano": "decimal", "end_unix_nano": "decimal",
//               "attributes": {...},
//               "status": {"code": 0|1|2, "message": "..."},
//               "events": [{"name": "...", "time_unix_nano": "decimal",
//                           "attributes": {...}}]}, ...]}
//
// T is string, bool, int (V a decimal string or a number), double (V a
// number) or array (V a list of {type, value} of one of those types).
//
// What the SDK can express, and so what this script accepts (anything else
// is rejected, never changed silently):
//
// * times: exact to the nanosecond. They are passed as HrTime [seconds,
//   nanoseconds] pairs, which the SDK keeps as given and the exporter writes
//   as fixed64 exactly (up to 2^64-1 ns); only a TimeInput given as a number
//   of milliseconds or a Date would be rounded, and none is used.
// * ids: exact. The span ids (and a root's trace id) come from an
//   IdGenerator that returns the document's; a child's trace id and parent
//   id come from the parent context built from the document.
// * int attributes are JS numbers: |V| must be at most 2^53-1. A double
//   whose value is an integer (2.0) would be sent as an int, so it is
//   rejected; NaN and infinities likewise (JSON cannot carry them here).
// * bytes and kvlist values, links, trace_state and kind 0 (UNSPECIFIED)
//   cannot be set on a span through the SDK's API: rejected.
// * the status message is kept by the SDK only for code 2 (ERROR), as the
//   specification says; a message with another code is rejected.
// * flags are the SDK's: 0x101 (sampled, "has is-remote"), 0x301 when the
//   parent is remote. The resource is exactly resource_attributes (no SDK
//   default attributes). Limits: at most 128 attributes and 128 events a
//   span (the SDK's defaults, unless OTEL_SPAN_*_LIMIT says otherwise).

import fs from 'node:fs';
import { parseArgs } from 'node:util';

import { ROOT_CONTEXT, SpanKind, TraceFlags, trace } from '@opentelemetry/api';
import { OTLPTraceExporter } from
  '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { AlwaysOnSampler, BasicTracerProvider } from
  '@opentelemetry/sdk-trace-base';

function die(message, code = 2) {
  process.stderr.write(`reference_spans: ${message}\n`);
  process.exit(code);
}

const { values: opts, positionals } = (() => {
  try {
    return parseArgs({
      options: {
        compression: { type: 'string', default: 'none' },
        header: { type: 'string', multiple: true, default: [] },
        'timeout-ms': { type: 'string', default: '10000' },
      },
      allowPositionals: true,
    });
  } catch (e) {
    die(e.message);
  }
})();
if (positionals.length !== 2) die('usage: reference_spans.mjs DOC.json URL');
const [docPath, url] = positionals;
if (!['gzip', 'none'].includes(opts.compression)) {
  die(`--compression ${opts.compression}: gzip or none`);
}
const headers = {};
for (const h of opts.header) {
  const eq = h.indexOf('=');
  if (eq <= 0) die(`--header ${h}: NAME=VALUE`);
  headers[h.slice(0, eq)] = h.slice(eq + 1);
}

let doc;
try {
  doc = JSON.parse(fs.readFileSync(docPath, 'utf8'));
} catch (e) {
  die(`${docPath}: ${e.message}`);
}

function hex(v, length, where) {
  if (typeof v !== 'string' || !new RegExp(`^[0-9a-f]{${length}}$`).test(v) ||
      /^0+$/.test(v)) {
    die(`${where}: ${JSON.stringify(v)} is not ${length} lowercase hex ` +
      'digits (nor all zero)');
  }
  return v;
}

function hrTime(v, where) {
  if (typeof v !== 'string' || !/^[0-9]+$/.test(v)) {
    die(`${where}: ${JSON.stringify(v)} is not a decimal string`);
  }
  const ns = BigInt(v);
  if (ns >= 1n << 64n) die(`${where}: beyond uint64`);
  return [Number(ns / 1000000000n), Number(ns % 1000000000n)];
}

function primitive(t, where) {
  if (!t || typeof t !== 'object') die(`${where}: not {type, value}`);
  const { type, value } = t;
  switch (type) {
    case 'string':
      if (typeof value !== 'string') die(`${where}: not a string`);
      return value;
    case 'bool':
      if (typeof value !== 'boolean') die(`${where}: not a bool`);
      return value;
    case 'int': {
      const s = String(value);
      if (!/^-?[0-9]+$/.test(s) || !Number.isSafeInteger(Number(s))) {
        die(`${where}: ${s} is not an integer within +-(2^53-1)`);
      }
      return Number(s);
    }
    case 'double':
      if (typeof value !== 'number' || !Number.isFinite(value) ||
          Number.isInteger(value)) {
        die(`${where}: ${JSON.stringify(value)}: a double the SDK sends as ` +
          'a double is finite and not integral');
      }
      return value;
    default:
      die(`${where}: type ${JSON.stringify(type)} cannot be set through ` +
        'the SDK');
  }
  return undefined;
}

function attributes(map, where) {
  const out = {};
  for (const [key, t] of Object.entries(map ?? {})) {
    if (t && t.type === 'array') {
      if (!Array.isArray(t.value)) die(`${where}.${key}: not a list`);
      const types = new Set(t.value.map(e => e && e.type));
      if (types.size > 1) die(`${where}.${key}: mixed element types`);
      out[key] = t.value.map((e, i) => primitive(e, `${where}.${key}[${i}]`));
    } else {
      out[key] = primitive(t, `${where}.${key}`);
    }
  }
  return out;
}

// Ids the SDK takes from here: each span's id, and a root's trace id.
const planned = { traceId: null, spanId: null };
const idGenerator = {
  generateTraceId: () => planned.traceId,
  generateSpanId: () => planned.spanId,
};
const ended = [];
const provider = new BasicTracerProvider({
  resource: resourceFromAttributes(attributes(doc.resource_attributes,
    'resource_attributes')),
  sampler: new AlwaysOnSampler(),
  idGenerator,
  spanProcessors: [{
    onStart() {},
    onEnd(span) { ended.push(span); },
    forceFlush: async () => {},
    shutdown: async () => {},
  }],
});
const scope = doc.scope ?? {};
const tracer = provider.getTracer(scope.name ?? '', scope.version);
const spans = Array.isArray(doc.spans) ? doc.spans : die('spans: not a list');
const ids = new Set(spans.map(s => s.span_id));

spans.forEach((s, i) => {
  const where = `spans[${i}]`;
  planned.traceId = hex(s.trace_id, 32, `${where}.trace_id`);
  planned.spanId = hex(s.span_id, 16, `${where}.span_id`);
  let context = ROOT_CONTEXT;
  if (s.parent_span_id) {
    context = trace.setSpanContext(ROOT_CONTEXT, {
      traceId: planned.traceId,
      spanId: hex(s.parent_span_id, 16, `${where}.parent_span_id`),
      traceFlags: TraceFlags.SAMPLED,
      isRemote: s.parent_is_remote ?? !ids.has(s.parent_span_id),
    });
  }
  const kind = s.kind ?? 1;
  if (!Number.isInteger(kind) || kind < 1 || kind > 5) {
    die(`${where}.kind: ${kind}: 1 (INTERNAL) to 5 (CONSUMER)`);
  }
  const span = tracer.startSpan(s.name ?? '', {
    kind: kind - 1 + SpanKind.INTERNAL,
    startTime: hrTime(s.start_unix_nano, `${where}.start_unix_nano`),
    attributes: attributes(s.attributes, `${where}.attributes`),
  }, context);
  (s.events ?? []).forEach((e, j) => {
    span.addEvent(e.name ?? '',
      attributes(e.attributes, `${where}.events[${j}].attributes`),
      hrTime(e.time_unix_nano, `${where}.events[${j}].time_unix_nano`));
  });
  const status = s.status ?? { code: 0, message: '' };
  if (![0, 1, 2].includes(status.code)) {
    die(`${where}.status.code: ${status.code}: 0, 1 or 2`);
  }
  if (status.message && status.code !== 2) {
    die(`${where}.status.message: the SDK keeps a message only with code 2`);
  }
  if (status.code !== 0) span.setStatus(status);
  span.end(hrTime(s.end_unix_nano, `${where}.end_unix_nano`));
  const ctx = span.spanContext();
  if (ctx.traceId !== s.trace_id || ctx.spanId !== s.span_id) {
    die(`${where}: the SDK made ${ctx.traceId}/${ctx.spanId}`);
  }
});

const exporter = new OTLPTraceExporter({
  url,
  headers,
  compression: opts.compression,
  timeoutMillis: Number(opts['timeout-ms']),
});
exporter.export(ended, result => {
  exporter.shutdown().finally(() => {
    if (result.code === 0) {
      process.stdout.write(`exported ${ended.length} spans\n`);
      process.exit(0);
    }
    die(`export failed: ${result.error?.message ?? result.code}`, 1);
  });
});
