// OTLP trace and metrics requests, decoded, in one normalized form, so that
// a protobuf body and an OTLP/JSON body of the same content give identical
// output (tests compare them with ==).
//
// Input: the camelCase object tree of an Export{Trace,Metrics}ServiceRequest,
// either from the generated code's toObject() (bytes as Uint8Array, 64-bit
// integers as decimal strings, enums as numbers) or from JSON.parse of an
// OTLP/JSON body (ids as hex strings, 64-bit integers as strings or numbers,
// bytes values as base64). Output (snake_case, every field present):
//
// * trace_id / span_id / parent_span_id: lowercase hex ("" when empty);
// * times and other 64-bit unsigned values: decimal strings of the integer;
// * attributes: {key: {type, value}}, type one of string, bool, int (value a
//   decimal string), double (a number, or "NaN", "Infinity", "-Infinity"),
//   bytes (value base64), array (value a list of {type, value}), kvlist
//   (value {key: {type, value}}), empty (value null);
// * enums as numbers; a proto3 `optional double` absent is null.
//
// What is not valid OTLP is reported, not hidden: `errors` gets one line per
// problem (a bad or wrongly sized id, a duplicate attribute key, a 64-bit
// integer sent as an inexact JSON number, an enum sent by name, two values in
// one AnyValue), `unknownFields` the JSON keys that are no OTLP field (an
// OTLP/JSON receiver ignores them; a test usually wants none).

// The Span.SpanKind, Status.StatusCode and AggregationTemporality names
// accepted, with an error, where OTLP/JSON wants the number.
const ENUM_NAMES = {
  kind: ['SPAN_KIND_UNSPECIFIED', 'SPAN_KIND_INTERNAL', 'SPAN_KIND_SERVER',
    'SPAN_KIND_CLIENT', 'SPAN_KIND_PRODUCER', 'SPAN_KIND_CONSUMER'],
  code: ['STATUS_CODE_UNSET', 'STATUS_CODE_OK', 'STATUS_CODE_ERROR'],
  aggregationTemporality: ['AGGREGATION_TEMPORALITY_UNSPECIFIED',
    'AGGREGATION_TEMPORALITY_DELTA', 'AGGREGATION_TEMPORALITY_CUMULATIVE'],
};

export class Normalizer {
  constructor(source) {
    this.json = source === 'json';
    this.errors = [];
    this.unknownFields = [];
  }

  // The keys of `o` (null or an object) that `known` lacks go to
  // unknownFields, named by `where`; returns o or {}.
  fields(o, where, known) {
    if (o == null) return {};
    if (typeof o !== 'object' || Array.isArray(o)) {
      this.errors.push(`${where}: not an object`);
      return {};
    }
    for (const k of Object.keys(o)) {
      if (!known.includes(k)) this.unknownFields.push(`${where}.${k}`);
    }
    return o;
  }

  list(v, where) {
    if (v == null) return [];
    if (!Array.isArray(v)) {
      this.errors.push(`${where}: not a list`);
      return [];
    }
    return v;
  }

  id(v, bytes, where) {
    let hex;
    if (v == null) {
      hex = '';
    } else if (v instanceof Uint8Array) {
      hex = Buffer.from(v).toString('hex');
    } else if (typeof v === 'string' && /^[0-9a-fA-F]*$/.test(v)) {
      hex = v.toLowerCase();
    } else {
      this.errors.push(`${where}: ${JSON.stringify(v)} is not hex`);
      return String(v);
    }
    if (hex.length !== 0 && hex.length !== 2 * bytes) {
      this.errors.push(`${where}: ${hex.length / 2} bytes, not ${bytes}`);
    }
    return hex;
  }

  // A 64-bit integer (signed when `signed`) as a decimal string.
  int64(v, where, signed = false) {
    if (v == null) return '0';
    const pattern = signed ? /^-?[0-9]+$/ : /^[0-9]+$/;
    if (typeof v === 'string' && pattern.test(v)) {
      return BigInt(v).toString();
    }
    if (typeof v === 'number' && Number.isInteger(v) && (signed || v >= 0)) {
      if (!Number.isSafeInteger(v)) {
        this.errors.push(`${where}: ${v} is a JSON number beyond 2^53 ` +
          '(inexact; OTLP/JSON sends 64-bit integers as strings)');
      }
      return BigInt(v).toString();
    }
    if (typeof v === 'object' && typeof v.toString === 'function' &&
        'low' in v && 'high' in v) {
      return v.toString();  // a Long
    }
    this.errors.push(`${where}: ${JSON.stringify(v)} is not an integer`);
    return String(v);
  }

  uint32(v, where) {
    if (v == null) return 0;
    if (typeof v === 'number' && Number.isInteger(v) && v >= 0 &&
        v <= 0xffffffff) {
      return v;
    }
    this.errors.push(`${where}: ${JSON.stringify(v)} is not a uint32`);
    return v;
  }

  int32(v, where) {
    if (v == null) return 0;
    if (typeof v === 'number' && Number.isInteger(v)) return v;
    this.errors.push(`${where}: ${JSON.stringify(v)} is not an int32`);
    return v;
  }

  double(v, where) {
    if (v == null) return 0;
    let d = v;
    if (typeof v === 'string') {
      d = Number(v);  // protobuf's JSON mapping: "NaN", "Infinity", "1.5"
      if (v.trim() === '' || (Number.isNaN(d) && v !== 'NaN')) {
        this.errors.push(`${where}: ${JSON.stringify(v)} is not a number`);
        return v;
      }
    } else if (typeof v !== 'number') {
      this.errors.push(`${where}: ${JSON.stringify(v)} is not a number`);
      return v;
    }
    if (Number.isNaN(d)) return 'NaN';
    if (d === Infinity) return 'Infinity';
    if (d === -Infinity) return '-Infinity';
    return d;
  }

  optionalDouble(v, where) {
    return v == null ? null : this.double(v, where);
  }

  bool(v, where) {
    if (v == null) return false;
    if (typeof v !== 'boolean') {
      this.errors.push(`${where}: ${JSON.stringify(v)} is not a bool`);
    }
    return Boolean(v);
  }

  string(v, where) {
    if (v == null) return '';
    if (typeof v !== 'string') {
      this.errors.push(`${where}: ${JSON.stringify(v)} is not a string`);
      return String(v);
    }
    return v;
  }

  bytes(v, where) {
    if (v instanceof Uint8Array) return Buffer.from(v).toString('base64');
    if (typeof v === 'string' &&
        /^[A-Za-z0-9+/_-]*={0,2}$/.test(v)) {
      return Buffer.from(v, 'base64').toString('base64');
    }
    this.errors.push(`${where}: ${JSON.stringify(v)} is not base64 bytes`);
    return String(v);
  }

  enumValue(v, name, where) {
    if (v == null) return 0;
    if (typeof v === 'number' && Number.isInteger(v)) return v;
    const names = ENUM_NAMES[name] || [];
    if (typeof v === 'string' && names.includes(v)) {
      this.errors.push(`${where}: enum by name ${v} (OTLP/JSON wants the ` +
        'integer)');
      return names.indexOf(v);
    }
    this.errors.push(`${where}: ${JSON.stringify(v)} is not an enum value`);
    return v;
  }

  anyValue(v, where) {
    const o = this.fields(v, where, ['stringValue', 'boolValue', 'intValue',
      'doubleValue', 'arrayValue', 'kvlistValue', 'bytesValue']);
    const set = Object.keys(o).filter(k => o[k] !== undefined &&
      o[k] !== null && k.endsWith('Value'));
    if (set.length === 0) return { type: 'empty', value: null };
    if (set.length > 1) {
      this.errors.push(`${where}: several values (${set.join(', ')})`);
    }
    const k = set[0];
    const x = o[k];
    switch (k) {
      case 'stringValue':
        return { type: 'string', value: this.string(x, `${where}.${k}`) };
      case 'boolValue':
        return { type: 'bool', value: this.bool(x, `${where}.${k}`) };
      case 'intValue':
        return { type: 'int', value: this.int64(x, `${where}.${k}`, true) };
      case 'doubleValue':
        return { type: 'double', value: this.double(x, `${where}.${k}`) };
      case 'bytesValue':
        return { type: 'bytes', value: this.bytes(x, `${where}.${k}`) };
      case 'arrayValue': {
        const a = this.fields(x, `${where}.${k}`, ['values']);
        return {
          type: 'array',
          value: this.list(a.values, `${where}.${k}.values`).map(
            (e, i) => this.anyValue(e, `${where}.${k}.values[${i}]`)),
        };
      }
      case 'kvlistValue': {
        const l = this.fields(x, `${where}.${k}`, ['values']);
        return {
          type: 'kvlist',
          value: this.attributes(l.values, `${where}.${k}.values`),
        };
      }
      default:
        this.errors.push(`${where}: unknown value ${k}`);
        return { type: 'empty', value: null };
    }
  }

  // repeated KeyValue -> {key: {type, value}}; a duplicate key is an error
  // (the last one is kept).
  attributes(v, where) {
    const out = {};
    this.list(v, where).forEach((kv, i) => {
      const o = this.fields(kv, `${where}[${i}]`, ['key', 'value']);
      const key = this.string(o.key, `${where}[${i}].key`);
      if (Object.prototype.hasOwnProperty.call(out, key)) {
        this.errors.push(`${where}: duplicate key ${JSON.stringify(key)}`);
      }
      out[key] = this.anyValue(o.value, `${where}[${i}].value`);
    });
    return out;
  }

  resource(v, where) {
    const o = this.fields(v, where, ['attributes', 'droppedAttributesCount',
      'entityRefs']);
    return {
      attributes: this.attributes(o.attributes, `${where}.attributes`),
      dropped_attributes_count: this.uint32(o.droppedAttributesCount,
        `${where}.droppedAttributesCount`),
      entity_refs: this.list(o.entityRefs, `${where}.entityRefs`).map(
        (e, i) => {
          const w = `${where}.entityRefs[${i}]`;
          const r = this.fields(e, w, ['schemaUrl', 'type', 'idKeys',
            'descriptionKeys']);
          return {
            schema_url: this.string(r.schemaUrl, `${w}.schemaUrl`),
            type: this.string(r.type, `${w}.type`),
            id_keys: this.list(r.idKeys, `${w}.idKeys`).map(
              s => this.string(s, `${w}.idKeys`)),
            description_keys: this.list(r.descriptionKeys,
              `${w}.descriptionKeys`).map(
              s => this.string(s, `${w}.descriptionKeys`)),
          };
        }),
    };
  }

  scope(v, where) {
    const o = this.fields(v, where, ['name', 'version', 'attributes',
      'droppedAttributesCount']);
    return {
      name: this.string(o.name, `${where}.name`),
      version: this.string(o.version, `${where}.version`),
      attributes: this.attributes(o.attributes, `${where}.attributes`),
      dropped_attributes_count: this.uint32(o.droppedAttributesCount,
        `${where}.droppedAttributesCount`),
    };
  }

  // ExportTraceServiceRequest -> {resource_spans: [...]}.
  traces(v) {
    const top = this.fields(v, 'request', ['resourceSpans']);
    return {
      resource_spans: this.list(top.resourceSpans, 'resourceSpans').map(
        (rs, i) => {
          const w = `resourceSpans[${i}]`;
          const r = this.fields(rs, w, ['resource', 'scopeSpans',
            'schemaUrl']);
          return {
            resource: this.resource(r.resource, `${w}.resource`),
            schema_url: this.string(r.schemaUrl, `${w}.schemaUrl`),
            scope_spans: this.list(r.scopeSpans, `${w}.scopeSpans`).map(
              (ss, j) => {
                const w2 = `${w}.scopeSpans[${j}]`;
                const s = this.fields(ss, w2, ['scope', 'spans', 'schemaUrl']);
                return {
                  scope: this.scope(s.scope, `${w2}.scope`),
                  schema_url: this.string(s.schemaUrl, `${w2}.schemaUrl`),
                  spans: this.list(s.spans, `${w2}.spans`).map(
                    (sp, k) => this.span(sp, `${w2}.spans[${k}]`)),
                };
              }),
          };
        }),
    };
  }

  span(v, where) {
    const o = this.fields(v, where, ['traceId', 'spanId', 'traceState',
      'parentSpanId', 'flags', 'name', 'kind', 'startTimeUnixNano',
      'endTimeUnixNano', 'attributes', 'droppedAttributesCount', 'events',
      'droppedEventsCount', 'links', 'droppedLinksCount', 'status']);
    const st = this.fields(o.status, `${where}.status`, ['message', 'code']);
    return {
      trace_id: this.id(o.traceId, 16, `${where}.traceId`),
      span_id: this.id(o.spanId, 8, `${where}.spanId`),
      trace_state: this.string(o.traceState, `${where}.traceState`),
      parent_span_id: this.id(o.parentSpanId, 8, `${where}.parentSpanId`),
      flags: this.uint32(o.flags, `${where}.flags`),
      name: this.string(o.name, `${where}.name`),
      kind: this.enumValue(o.kind, 'kind', `${where}.kind`),
      start_time_unix_nano: this.int64(o.startTimeUnixNano,
        `${where}.startTimeUnixNano`),
      end_time_unix_nano: this.int64(o.endTimeUnixNano,
        `${where}.endTimeUnixNano`),
      attributes: this.attributes(o.attributes, `${where}.attributes`),
      dropped_attributes_count: this.uint32(o.droppedAttributesCount,
        `${where}.droppedAttributesCount`),
      events: this.list(o.events, `${where}.events`).map((e, i) => {
        const w = `${where}.events[${i}]`;
        const ev = this.fields(e, w, ['timeUnixNano', 'name', 'attributes',
          'droppedAttributesCount']);
        return {
          time_unix_nano: this.int64(ev.timeUnixNano, `${w}.timeUnixNano`),
          name: this.string(ev.name, `${w}.name`),
          attributes: this.attributes(ev.attributes, `${w}.attributes`),
          dropped_attributes_count: this.uint32(ev.droppedAttributesCount,
            `${w}.droppedAttributesCount`),
        };
      }),
      dropped_events_count: this.uint32(o.droppedEventsCount,
        `${where}.droppedEventsCount`),
      links: this.list(o.links, `${where}.links`).map((l, i) => {
        const w = `${where}.links[${i}]`;
        const lk = this.fields(l, w, ['traceId', 'spanId', 'traceState',
          'attributes', 'droppedAttributesCount', 'flags']);
        return {
          trace_id: this.id(lk.traceId, 16, `${w}.traceId`),
          span_id: this.id(lk.spanId, 8, `${w}.spanId`),
          trace_state: this.string(lk.traceState, `${w}.traceState`),
          attributes: this.attributes(lk.attributes, `${w}.attributes`),
          dropped_attributes_count: this.uint32(lk.droppedAttributesCount,
            `${w}.droppedAttributesCount`),
          flags: this.uint32(lk.flags, `${w}.flags`),
        };
      }),
      dropped_links_count: this.uint32(o.droppedLinksCount,
        `${where}.droppedLinksCount`),
      status: {
        code: this.enumValue(st.code, 'code', `${where}.status.code`),
        message: this.string(st.message, `${where}.status.message`),
      },
    };
  }

  // ExportMetricsServiceRequest -> {resource_metrics: [...]}.
  metrics(v) {
    const top = this.fields(v, 'request', ['resourceMetrics']);
    return {
      resource_metrics: this.list(top.resourceMetrics, 'resourceMetrics').map(
        (rm, i) => {
          const w = `resourceMetrics[${i}]`;
          const r = this.fields(rm, w, ['resource', 'scopeMetrics',
            'schemaUrl']);
          return {
            resource: this.resource(r.resource, `${w}.resource`),
            schema_url: this.string(r.schemaUrl, `${w}.schemaUrl`),
            scope_metrics: this.list(r.scopeMetrics, `${w}.scopeMetrics`).map(
              (sm, j) => {
                const w2 = `${w}.scopeMetrics[${j}]`;
                const s = this.fields(sm, w2, ['scope', 'metrics',
                  'schemaUrl']);
                return {
                  scope: this.scope(s.scope, `${w2}.scope`),
                  schema_url: this.string(s.schemaUrl, `${w2}.schemaUrl`),
                  metrics: this.list(s.metrics, `${w2}.metrics`).map(
                    (m, k) => this.metric(m, `${w2}.metrics[${k}]`)),
                };
              }),
          };
        }),
    };
  }

  // A Metric, its data flattened in: {name, description, unit, metadata,
  // type: gauge|sum|histogram|exponential_histogram|summary|none, the
  // type's own fields, data_points}.
  metric(v, where) {
    const kinds = { gauge: 'gauge', sum: 'sum', histogram: 'histogram',
      exponentialHistogram: 'exponential_histogram', summary: 'summary' };
    const o = this.fields(v, where, ['name', 'description', 'unit',
      'metadata', ...Object.keys(kinds)]);
    const out = {
      name: this.string(o.name, `${where}.name`),
      description: this.string(o.description, `${where}.description`),
      unit: this.string(o.unit, `${where}.unit`),
      metadata: this.attributes(o.metadata, `${where}.metadata`),
    };
    const set = Object.keys(kinds).filter(k => o[k] != null);
    if (set.length === 0) {
      out.type = 'none';
      out.data_points = [];
      return out;
    }
    if (set.length > 1) {
      this.errors.push(`${where}: several data kinds (${set.join(', ')})`);
    }
    const k = set[0];
    const w = `${where}.${k}`;
    out.type = kinds[k];
    const d = this.fields(o[k], w, ['dataPoints', 'aggregationTemporality',
      'isMonotonic']);
    if (k === 'sum' || k === 'histogram' || k === 'exponentialHistogram') {
      out.aggregation_temporality = this.enumValue(d.aggregationTemporality,
        'aggregationTemporality', `${w}.aggregationTemporality`);
    } else if (d.aggregationTemporality != null) {
      this.unknownFields.push(`${w}.aggregationTemporality`);
    }
    if (k === 'sum') {
      out.is_monotonic = this.bool(d.isMonotonic, `${w}.isMonotonic`);
    } else if (d.isMonotonic != null) {
      this.unknownFields.push(`${w}.isMonotonic`);
    }
    const point = {
      gauge: this.numberPoint, sum: this.numberPoint,
      histogram: this.histogramPoint,
      exponentialHistogram: this.exponentialPoint, summary: this.summaryPoint,
    }[k];
    out.data_points = this.list(d.dataPoints, `${w}.dataPoints`).map(
      (p, i) => point.call(this, p, `${w}.dataPoints[${i}]`));
    return out;
  }

  pointCommon(o, where) {
    return {
      attributes: this.attributes(o.attributes, `${where}.attributes`),
      start_time_unix_nano: this.int64(o.startTimeUnixNano,
        `${where}.startTimeUnixNano`),
      time_unix_nano: this.int64(o.timeUnixNano, `${where}.timeUnixNano`),
    };
  }

  numberValue(o, where) {
    if (o.asDouble != null && o.asInt != null) {
      this.errors.push(`${where}: both asDouble and asInt`);
    }
    if (o.asDouble != null) {
      return { type: 'double', value: this.double(o.asDouble,
        `${where}.asDouble`) };
    }
    if (o.asInt != null) {
      return { type: 'int', value: this.int64(o.asInt, `${where}.asInt`,
        true) };
    }
    return { type: 'empty', value: null };
  }

  exemplars(v, where) {
    return this.list(v, where).map((e, i) => {
      const w = `${where}[${i}]`;
      const o = this.fields(e, w, ['filteredAttributes', 'timeUnixNano',
        'asDouble', 'asInt', 'spanId', 'traceId']);
      return {
        filtered_attributes: this.attributes(o.filteredAttributes,
          `${w}.filteredAttributes`),
        time_unix_nano: this.int64(o.timeUnixNano, `${w}.timeUnixNano`),
        value: this.numberValue(o, w),
        span_id: this.id(o.spanId, 8, `${w}.spanId`),
        trace_id: this.id(o.traceId, 16, `${w}.traceId`),
      };
    });
  }

  numberPoint(v, where) {
    const o = this.fields(v, where, ['attributes', 'startTimeUnixNano',
      'timeUnixNano', 'asDouble', 'asInt', 'exemplars', 'flags']);
    return {
      ...this.pointCommon(o, where),
      value: this.numberValue(o, where),
      exemplars: this.exemplars(o.exemplars, `${where}.exemplars`),
      flags: this.uint32(o.flags, `${where}.flags`),
    };
  }

  histogramPoint(v, where) {
    const o = this.fields(v, where, ['attributes', 'startTimeUnixNano',
      'timeUnixNano', 'count', 'sum', 'bucketCounts', 'explicitBounds',
      'exemplars', 'flags', 'min', 'max']);
    return {
      ...this.pointCommon(o, where),
      count: this.int64(o.count, `${where}.count`),
      sum: this.optionalDouble(o.sum, `${where}.sum`),
      bucket_counts: this.list(o.bucketCounts, `${where}.bucketCounts`).map(
        (c, i) => this.int64(c, `${where}.bucketCounts[${i}]`)),
      explicit_bounds: this.list(o.explicitBounds,
        `${where}.explicitBounds`).map(
        (b, i) => this.double(b, `${where}.explicitBounds[${i}]`)),
      exemplars: this.exemplars(o.exemplars, `${where}.exemplars`),
      flags: this.uint32(o.flags, `${where}.flags`),
      min: this.optionalDouble(o.min, `${where}.min`),
      max: this.optionalDouble(o.max, `${where}.max`),
    };
  }

  buckets(v, where) {
    const o = this.fields(v, where, ['offset', 'bucketCounts']);
    return {
      offset: this.int32(o.offset, `${where}.offset`),
      bucket_counts: this.list(o.bucketCounts, `${where}.bucketCounts`).map(
        (c, i) => this.int64(c, `${where}.bucketCounts[${i}]`)),
    };
  }

  exponentialPoint(v, where) {
    const o = this.fields(v, where, ['attributes', 'startTimeUnixNano',
      'timeUnixNano', 'count', 'sum', 'scale', 'zeroCount', 'positive',
      'negative', 'flags', 'exemplars', 'min', 'max', 'zeroThreshold']);
    return {
      ...this.pointCommon(o, where),
      count: this.int64(o.count, `${where}.count`),
      sum: this.optionalDouble(o.sum, `${where}.sum`),
      scale: this.int32(o.scale, `${where}.scale`),
      zero_count: this.int64(o.zeroCount, `${where}.zeroCount`),
      positive: this.buckets(o.positive, `${where}.positive`),
      negative: this.buckets(o.negative, `${where}.negative`),
      flags: this.uint32(o.flags, `${where}.flags`),
      exemplars: this.exemplars(o.exemplars, `${where}.exemplars`),
      min: this.optionalDouble(o.min, `${where}.min`),
      max: this.optionalDouble(o.max, `${where}.max`),
      zero_threshold: this.double(o.zeroThreshold, `${where}.zeroThreshold`),
    };
  }

  summaryPoint(v, where) {
    const o = this.fields(v, where, ['attributes', 'startTimeUnixNano',
      'timeUnixNano', 'count', 'sum', 'quantileValues', 'flags']);
    return {
      ...this.pointCommon(o, where),
      count: this.int64(o.count, `${where}.count`),
      sum: this.double(o.sum, `${where}.sum`),
      quantile_values: this.list(o.quantileValues,
        `${where}.quantileValues`).map((q, i) => {
        const w = `${where}.quantileValues[${i}]`;
        const qv = this.fields(q, w, ['quantile', 'value']);
        return {
          quantile: this.double(qv.quantile, `${w}.quantile`),
          value: this.double(qv.value, `${w}.value`),
        };
      }),
      flags: this.uint32(o.flags, `${where}.flags`),
    };
  }
}

// The number of spans, or of data points, in a normalized message.
export function countItems(signal, message) {
  let n = 0;
  if (signal === 'traces') {
    for (const rs of message.resource_spans) {
      for (const ss of rs.scope_spans) n += ss.spans.length;
    }
  } else {
    for (const rm of message.resource_metrics) {
      for (const sm of rm.scope_metrics) {
        for (const m of sm.metrics) n += m.data_points.length;
      }
    }
  }
  return n;
}
