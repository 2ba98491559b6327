#!/usr/bin/env node
// An OTLP/HTTP receiver for tokenmeter's tests, decoding with OpenTelemetry's
// code (docs/testing.md, "OpenTelemetry (OTLP) test tooling").
//
//   node tests/otel/receiver.mjs [--out FILE] [--port N] [fault flags]
//
// Listens on --host (127.0.0.1) port --port (0: any), prints "PORT <n>" on
// stdout once listening, and answers POST /v1/traces and /v1/metrics with
// Content-Type exactly application/x-protobuf or application/json,
// Content-Encoding gzip or none:
//
// * protobuf bodies are decoded by ExportTraceServiceRequest /
//   ExportMetricsServiceRequest.decode of the protobufjs code OpenTelemetry
//   generated from the OTLP .proto files and ships in
//   @opentelemetry/otlp-transformer 0.216.0 (build/src/generated/root.js);
// * JSON trace bodies also go through @opentelemetry/contrib-test-utils'
//   TestCollector request handler (it checks the Content-Type, gunzips,
//   JSON.parse-s and collects the spans; it handles nothing else: no
//   protobuf, no metrics); its answer is the receiver's, and the spans it
//   collected must equal those of the receiver's own JSON.parse, else an
//   error is recorded. JSON metrics bodies are JSON.parse-d only.
//
// Every request, faulted or not, appends one JSON line to --out (stdout when
// absent), written synchronously: {seq, method, path, signal, content_type,
// content_encoding, headers (x-*, authorization, user-agent), body_bytes,
// decoded_bytes, received_unix_nano, monotonic_ns (CLOCK_MONOTONIC, as
// Python's time.monotonic_ns()), tls, fault, status (null when not
// answered), decoder, errors, unknown_fields, items (spans or data points),
// test_collector (JSON traces only), message}; `message` is the normalized
// request of otlp_normalize.mjs (identical for protobuf and JSON bodies of
// the same content), null when the body could not be decoded.
//
// Fault modes, applied in this order by the request's ordinal (all requests
// count): the first --reset-count N have their connection reset (TCP RST)
// after the body was read; the next --stall-count N (all, with --stall) are
// read and never answered; the next --fail-count N (all when only
// --fail-status is given) get --fail-status CODE with `Retry-After:
// --retry-after` if given; the rest are answered 200 with an empty
// Export*ServiceResponse in the request's encoding, or, with
// --partial-success N [--partial-message TEXT], one whose partial_success
// rejects N spans / data points.
//
// TLS: --tls-cert and --tls-key serve HTTPS; with --client-ca a client
// certificate signed by that CA is required (handshakes without one fail and
// are counted). SIGTERM or SIGINT: one line of counts on stderr, exit 0.

import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import zlib from 'node:zlib';
import { createRequire } from 'node:module';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { Normalizer, countItems } from './otlp_normalize.mjs';

const require = createRequire(import.meta.url);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT_MODULE =
  '@opentelemetry/otlp-transformer/build/src/generated/root.js';
const root = require(ROOT_MODULE);
const protobuf = require(require.resolve('protobufjs/minimal',
  { paths: [path.dirname(require.resolve(ROOT_MODULE))] }));
const { TestCollector } = require('@opentelemetry/contrib-test-utils');

const MAX_BODY_BYTES = 64 << 20;  // larger bodies are answered 413
const PROTOBUF = 'application/x-protobuf';
const JSON_TYPE = 'application/json';
const collectorV1 = root.opentelemetry.proto.collector;
const SIGNALS = {
  '/v1/traces': {
    name: 'traces',
    request: collectorV1.trace.v1.ExportTraceServiceRequest,
    response: collectorV1.trace.v1.ExportTraceServiceResponse,
    rejected: 'rejectedSpans',
  },
  '/v1/metrics': {
    name: 'metrics',
    request: collectorV1.metrics.v1.ExportMetricsServiceRequest,
    response: collectorV1.metrics.v1.ExportMetricsServiceResponse,
    rejected: 'rejectedDataPoints',
  },
};

function packageVersion(name) {
  const file = path.join(HERE, 'node_modules', name, 'package.json');
  return JSON.parse(fs.readFileSync(file, 'utf8')).version;
}

function die(message) {
  process.stderr.write(`receiver: ${message}\n`);
  process.exit(2);
}

function count(value, flag) {
  if (value === undefined) return 0;
  if (!/^[0-9]+$/.test(value)) die(`${flag} wants a count, not ${value}`);
  return Number(value);
}

const { values: opts } = (() => {
  try {
    return parseArgs({
      options: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string', default: '0' },
        out: { type: 'string' },
        'fail-status': { type: 'string' },
        'fail-count': { type: 'string' },
        'retry-after': { type: 'string' },
        'reset-count': { type: 'string' },
        stall: { type: 'boolean', default: false },
        'stall-count': { type: 'string' },
        'partial-success': { type: 'string' },
        'partial-message': { type: 'string', default: '' },
        'tls-cert': { type: 'string' },
        'tls-key': { type: 'string' },
        'client-ca': { type: 'string' },
      },
      strict: true,
      allowPositionals: false,
    });
  } catch (e) {
    die(e.message);
  }
})();

// The fault plan: [kind, requests] in the order they apply.
const failStatus = opts['fail-status'] === undefined ? null :
  count(opts['fail-status'], '--fail-status');
if (failStatus !== null && (failStatus < 100 || failStatus > 599)) {
  die(`--fail-status ${failStatus} is no HTTP status`);
}
if (failStatus === null && (opts['fail-count'] !== undefined ||
    opts['retry-after'] !== undefined)) {
  die('--fail-count and --retry-after need --fail-status');
}
if (opts.stall && opts['stall-count'] !== undefined) {
  die('--stall and --stall-count exclude each other');
}
const plan = [
  ['reset', count(opts['reset-count'], '--reset-count')],
  ['stall', opts.stall ? Infinity : count(opts['stall-count'],
    '--stall-count')],
  ['fail', failStatus === null ? 0 : opts['fail-count'] === undefined ?
    Infinity : count(opts['fail-count'], '--fail-count')],
];
const partialRejected = opts['partial-success'] === undefined ? null :
  count(opts['partial-success'], '--partial-success');
if ((opts['tls-cert'] === undefined) !== (opts['tls-key'] === undefined)) {
  die('--tls-cert and --tls-key go together');
}
if (opts['client-ca'] !== undefined && opts['tls-cert'] === undefined) {
  die('--client-ca needs --tls-cert and --tls-key');
}
if (!protobuf.util.Long) {
  die('protobufjs found no "long" package: 64-bit values would be inexact');
}

const versions = {
  transformer: packageVersion('@opentelemetry/otlp-transformer'),
  testUtils: packageVersion('@opentelemetry/contrib-test-utils'),
};
const out = opts.out === undefined ? 1 : fs.openSync(opts.out, 'a');
const counts = { received: 0, ok: 0, failed_status: 0, reset: 0, stalled: 0,
  bad: 0, tls_errors: 0 };
const stalled = new Set();

function faultFor(ordinal) {
  let first = 0;
  for (const [kind, n] of plan) {
    if (ordinal < first + n) return kind;
    first += n;
  }
  return null;
}

function unixNanoNow() {
  const ms = performance.timeOrigin + performance.now();
  return (BigInt(Math.floor(ms)) * 1000000n +
    BigInt(Math.round((ms % 1) * 1e6))).toString();
}

function headersOfInterest(headers) {
  const picked = {};
  for (const [name, value] of Object.entries(headers)) {
    if (name.startsWith('x-') || name === 'authorization' ||
        name === 'user-agent') {
      picked[name] = Array.isArray(value) ? value.join(', ') : value;
    }
  }
  return picked;
}

// Runs contrib-test-utils' TestCollector request handler on a copy of the
// request (raw body and headers); resolves to {status, spans}.
function runTestCollector(req, raw) {
  const collector = new TestCollector();
  collector.endpointUrl = 'http://127.0.0.1';  // as start() would set it
  const copy = new Readable({ read() {} });
  copy.method = req.method;
  copy.url = req.url;
  copy.headers = { ...req.headers };
  copy.push(raw);
  copy.push(null);
  return new Promise(resolve => {
    const res = {
      status: null,
      writeHead(status) { this.status = status; },
      end() { resolve({ status: this.status, spans: collector.spans }); },
    };
    collector._onRequest(copy, res);
  });
}

// The JSON spans of a parsed OTLP/JSON trace request, flattened as
// TestCollector flattens them; null when its shape would make TestCollector
// throw (a list missing).
function flattenJsonSpans(data) {
  const spans = [];
  if (!data || !Array.isArray(data.resourceSpans)) return null;
  for (const rs of data.resourceSpans) {
    if (!rs || !Array.isArray(rs.scopeSpans)) return null;
    for (const ss of rs.scopeSpans) {
      if (!ss || !Array.isArray(ss.spans)) return null;
      spans.push(...ss.spans);
    }
  }
  return spans;
}

async function decode(req, raw, signal, record) {
  const type = req.headers['content-type'];
  const encoding = req.headers['content-encoding'];
  if (type !== PROTOBUF && type !== JSON_TYPE) {
    record.errors.push(`Content-Type ${JSON.stringify(type)} is neither ` +
      `${PROTOBUF} nor ${JSON_TYPE}`);
    return 415;
  }
  let body = raw;
  if (encoding === 'gzip') {
    try {
      body = zlib.gunzipSync(raw);
    } catch (e) {
      record.errors.push(`gzip: ${e.message}`);
      return 400;
    }
  } else if (encoding !== undefined && encoding !== 'identity') {
    record.errors.push(`Content-Encoding ${encoding} is not supported`);
    return 415;
  }
  record.decoded_bytes = body.length;
  let status = 200;
  const normalizer = new Normalizer(type === JSON_TYPE ? 'json' : 'protobuf');
  let tree;
  if (type === PROTOBUF) {
    record.decoder = `protobuf: @opentelemetry/otlp-transformer ` +
      `${versions.transformer} generated root`;
    try {
      const message = signal.request.decode(body);
      tree = signal.request.toObject(message, { longs: String,
        enums: Number, defaults: true, arrays: true, objects: true });
    } catch (e) {
      record.errors.push(`protobuf: ${e.message}`);
      return 400;
    }
  } else {
    record.decoder = 'json: JSON.parse';
    try {
      tree = JSON.parse(body.toString('utf8'));
    } catch (e) {
      record.errors.push(`JSON: ${e.message}`);
      return 400;
    }
    if (signal.name === 'traces') {
      record.decoder = `json: TestCollector (@opentelemetry/` +
        `contrib-test-utils ${versions.testUtils}) and JSON.parse`;
      const ours = flattenJsonSpans(tree);
      if (ours === null) {
        record.errors.push('TestCollector: resourceSpans, scopeSpans or ' +
          'spans is not a list');
        record.test_collector = { status: null, spans: null };
      } else {
        const tc = await runTestCollector(req, raw);
        record.test_collector = { status: tc.status, spans: tc.spans.length };
        const strip = s => {
          const { resource, instrumentationScope, ...span } = s;
          return JSON.stringify(span);
        };
        if (tc.status !== 200) {
          record.errors.push(`TestCollector answered ${tc.status}`);
          status = tc.status;
        } else if (tc.spans.length !== ours.length ||
            tc.spans.some((s, i) => strip(s) !== JSON.stringify(ours[i]))) {
          record.errors.push('TestCollector collected other spans than ' +
            'JSON.parse found');
        }
      }
    }
  }
  record.message = normalizer[signal.name](tree);
  record.items = countItems(signal.name, record.message);
  record.errors.push(...normalizer.errors);
  record.unknown_fields = normalizer.unknownFields;
  return status;
}

function responseBody(signal, type, status) {
  if (type === PROTOBUF) {
    if (status !== 200 || partialRejected === null) return Buffer.alloc(0);
    const message = signal.response.create({ partialSuccess: {
      [signal.rejected]: partialRejected,
      errorMessage: opts['partial-message'] } });
    return Buffer.from(signal.response.encode(message).finish());
  }
  if (status !== 200 || partialRejected === null) return '{}';
  return JSON.stringify({ partialSuccess: {
    [signal.rejected]: String(partialRejected),
    errorMessage: opts['partial-message'] } });
}

function writeRecord(record) {
  fs.writeSync(out, JSON.stringify(record) + '\n');
}

async function handle(req, res, raw, tooLarge) {
  const ordinal = counts.received++;
  const signal = SIGNALS[req.url];
  const record = {
    seq: ordinal,
    method: req.method,
    path: req.url,
    signal: signal ? signal.name : null,
    content_type: req.headers['content-type'] ?? null,
    content_encoding: req.headers['content-encoding'] ?? null,
    headers: headersOfInterest(req.headers),
    body_bytes: raw.length,
    decoded_bytes: null,
    received_unix_nano: unixNanoNow(),
    monotonic_ns: process.hrtime.bigint().toString(),
    tls: req.socket.encrypted ? {
      authorized: req.socket.authorized,
      peer_subject: req.socket.getPeerCertificate()?.subject?.CN ?? null,
    } : null,
    fault: null,
    status: null,
    decoder: null,
    errors: [],
    unknown_fields: [],
    items: null,
    test_collector: null,
    message: null,
  };
  let status;
  if (tooLarge) {
    status = 413;
    record.errors.push(`body over ${MAX_BODY_BYTES} bytes`);
  } else if (!signal) {
    status = 404;
    record.errors.push(`no OTLP signal at ${req.url}`);
  } else if (req.method !== 'POST') {
    status = 405;
    record.errors.push(`method ${req.method}`);
  } else {
    status = await decode(req, raw, signal, record);
  }
  const fault = faultFor(ordinal);
  if (fault === 'reset') {
    record.fault = 'reset';
    counts.reset++;
    writeRecord(record);
    req.socket.resetAndDestroy();
    return;
  }
  if (fault === 'stall') {
    record.fault = 'stall';
    counts.stalled++;
    writeRecord(record);
    stalled.add(req.socket);
    req.socket.once('close', () => stalled.delete(req.socket));
    return;
  }
  const type = record.content_type === PROTOBUF ? PROTOBUF : JSON_TYPE;
  const headers = { 'Content-Type': type };
  if (fault === 'fail') {
    record.fault = `status ${failStatus}`;
    status = failStatus;
    counts.failed_status++;
    if (opts['retry-after'] !== undefined) {
      headers['Retry-After'] = opts['retry-after'];
    }
  } else if (status === 200) {
    counts.ok++;
  } else {
    counts.bad++;
  }
  record.status = status;
  writeRecord(record);
  const body = signal ? responseBody(signal, type, status) : '{}';
  headers['Content-Length'] = Buffer.byteLength(body);
  res.writeHead(status, headers);
  res.end(body);
}

// A request whose client went away before its body ended: recorded (no
// message, status null), counted as bad.
function recordAborted(req, size) {
  counts.received++;
  counts.bad++;
  writeRecord({ seq: counts.received - 1, method: req.method, path: req.url,
    signal: SIGNALS[req.url]?.name ?? null,
    content_type: req.headers['content-type'] ?? null,
    content_encoding: req.headers['content-encoding'] ?? null,
    headers: headersOfInterest(req.headers), body_bytes: size,
    decoded_bytes: null, received_unix_nano: unixNanoNow(),
    monotonic_ns: process.hrtime.bigint().toString(), tls: null,
    fault: null, status: null, decoder: null,
    errors: ['the client closed the connection before the body ended'],
    unknown_fields: [], items: null, test_collector: null, message: null });
}

function onRequest(req, res) {
  const chunks = [];
  let size = 0;
  let tooLarge = false;
  req.on('error', () => {});  // an abort; 'close' below records it
  req.on('close', () => {
    if (!req.complete) recordAborted(req, size);
  });
  req.on('data', chunk => {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) {
      tooLarge = true;
    } else {
      chunks.push(chunk);
    }
  });
  req.on('end', () => {
    handle(req, res, Buffer.concat(chunks), tooLarge).catch(e => {
      process.stderr.write(`receiver: ${e.stack}\n`);
      process.exit(1);
    });
  });
}

let server;
if (opts['tls-cert'] !== undefined) {
  const options = {
    cert: fs.readFileSync(opts['tls-cert']),
    key: fs.readFileSync(opts['tls-key']),
  };
  if (opts['client-ca'] !== undefined) {
    options.ca = fs.readFileSync(opts['client-ca']);
    options.requestCert = true;
    options.rejectUnauthorized = true;
  }
  server = https.createServer(options, onRequest);
  server.on('tlsClientError', () => { counts.tls_errors++; });
} else {
  server = http.createServer(onRequest);
}
server.requestTimeout = 0;  // a slow sender is the sender's test, not ours

function shutdown() {
  const line = Object.entries(counts).map(([k, v]) => `${k}=${v}`).join(' ');
  process.stderr.write(`receiver: ${line}\n`);
  for (const socket of stalled) socket.destroy();
  if (out !== 1) fs.closeSync(out);
  process.exit(0);
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);

server.on('error', e => die(`listen on ${opts.host}:${opts.port}: ` +
  e.message));
server.listen(count(opts.port, '--port'), opts.host, () => {
  process.stdout.write(`PORT ${server.address().port}\n`);
});
