#include "daemon/http/negotiation.h"

#include <cstddef>

#include "daemon/base/ascii.h"

namespace tokenmeter::daemon::http {
namespace {

constexpr std::string_view kTextContentType =
    "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view kOpenMetricsContentType =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
constexpr std::string_view kProtobufContentType =
    "application/vnd.google.protobuf; "
    "proto=io.prometheus.client.MetricFamily; encoding=delimited";

// q-values are kept in thousandths; -1 marks "no range matched".
constexpr int kQMax = 1000;

bool IsOws(char c) { return c == ' ' || c == '\t'; }

// RFC 9110 tchar.
bool IsTchar(char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
      (c >= 'A' && c <= 'Z')) {
    return true;
  }
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

// qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] ), in
// thousandths; -1 when malformed.
int ParseQ(std::string_view v) {
  if (v.empty() || (v[0] != '0' && v[0] != '1')) return -1;
  int whole = v[0] - '0';
  if (v.size() == 1) return whole * kQMax;
  if (v[1] != '.' || v.size() > 5) return -1;
  int frac = 0;
  int scale = 100;
  for (size_t i = 2; i < v.size(); ++i) {
    if (v[i] < '0' || v[i] > '9') return -1;
    frac += (v[i] - '0') * scale;
    scale /= 10;
  }
  if (whole == 1 && frac != 0) return -1;
  return whole * kQMax + frac;
}

// Calls fn(element) for each comma-separated element of a header value,
// splitting only outside quoted strings. Elements are not trimmed.
template <typename Fn>
void ForEachElement(std::string_view header, Fn fn) {
  size_t start = 0;
  bool in_quotes = false;
  for (size_t i = 0; i < header.size(); ++i) {
    char c = header[i];
    if (in_quotes) {
      if (c == '\\') {
        ++i;  // The escaped byte (if any) cannot end the string.
      } else if (c == '"') {
        in_quotes = false;
      }
    } else if (c == '"') {
      in_quotes = true;
    } else if (c == ',') {
      fn(header.substr(start, i - start));
      start = i + 1;
    }
  }
  if (start <= header.size()) fn(header.substr(start));
}

class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  bool AtEnd() const { return i_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[i_]; }
  void SkipOws() {
    while (!AtEnd() && IsOws(s_[i_])) ++i_;
  }
  bool Consume(char c) {
    if (AtEnd() || s_[i_] != c) return false;
    ++i_;
    return true;
  }
  std::string_view Token() {
    size_t start = i_;
    while (!AtEnd() && IsTchar(s_[i_])) ++i_;
    return s_.substr(start, i_ - start);
  }
  // A quoted-string's raw inside (escapes left as they are); false when
  // unterminated.
  bool QuotedString(std::string_view* inner) {
    if (!Consume('"')) return false;
    size_t start = i_;
    while (!AtEnd()) {
      char c = s_[i_];
      if (c == '\\') {
        i_ += 2;
      } else if (c == '"') {
        *inner = s_.substr(start, i_ - start);
        ++i_;
        return true;
      } else {
        ++i_;
      }
    }
    return false;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

// One element of Accept or Accept-Encoding, with the parameters the
// negotiation looks at.
struct Element {
  std::string_view type;
  std::string_view subtype;  // Empty for Accept-Encoding codings.
  int q = kQMax;
  bool has_version = false;
  std::string_view version;
  bool has_charset = false;
  std::string_view charset;
  std::string_view proto;     // the protobuf range's parameters
  std::string_view encoding;  // (empty: absent)
};

// Parses `token [ "/" token ] *( OWS ";" OWS [ token BWS "=" BWS
// ( token / quoted-string ) ] )` surrounded by OWS. Parameters after q are
// accept-ext and do not take part in matching. False when malformed.
bool ParseElement(std::string_view text, bool media_range, Element* out) {
  Cursor cur(text);
  cur.SkipOws();
  out->type = cur.Token();
  if (out->type.empty()) return false;
  if (media_range) {
    if (!cur.Consume('/')) return false;
    out->subtype = cur.Token();
    if (out->subtype.empty()) return false;
    if (out->type == "*" && out->subtype != "*") return false;
  }
  bool seen_q = false;
  while (true) {
    cur.SkipOws();
    if (cur.AtEnd()) return true;
    if (!cur.Consume(';')) return false;
    cur.SkipOws();
    if (cur.AtEnd()) return true;  // A trailing ';' is harmless.
    std::string_view name = cur.Token();
    if (name.empty()) return false;
    cur.SkipOws();
    if (!cur.Consume('=')) return false;
    cur.SkipOws();
    std::string_view value;
    bool quoted = false;
    if (cur.Peek() == '"') {
      if (!cur.QuotedString(&value)) return false;
      quoted = true;
    } else {
      value = cur.Token();
      if (value.empty()) return false;
    }
    if (seen_q) continue;
    if (EqualsIgnoreCase(name, "q")) {
      if (quoted) return false;
      int q = ParseQ(value);
      if (q < 0) return false;
      out->q = q;
      seen_q = true;
    } else if (EqualsIgnoreCase(name, "version")) {
      out->has_version = true;
      out->version = value;
    } else if (EqualsIgnoreCase(name, "charset")) {
      out->has_charset = true;
      out->charset = value;
    } else if (EqualsIgnoreCase(name, "proto")) {
      out->proto = value;
    } else if (EqualsIgnoreCase(name, "encoding")) {
      out->encoding = value;
    }
  }
}

// A format as a concrete media type the server can produce.
struct Candidate {
  std::string_view type;
  std::string_view subtype;
  std::string_view version;
};
constexpr Candidate kTextCandidate{"text", "plain", "0.0.4"};
constexpr Candidate kOpenMetricsCandidate{"application", "openmetrics-text",
                                          "1.0.0"};

// How specifically a media range matches a candidate, or -1 when it does
// not: */* < type/* < type/subtype, each refined by matching parameters.
int MatchSpecificity(const Element& e, const Candidate& c) {
  int specificity;
  if (e.type == "*") {
    specificity = 0;
  } else if (!EqualsIgnoreCase(e.type, c.type)) {
    return -1;
  } else if (e.subtype == "*") {
    specificity = 10;
  } else if (EqualsIgnoreCase(e.subtype, c.subtype)) {
    specificity = 20;
  } else {
    return -1;
  }
  if (e.has_version) {
    if (e.version != c.version) return -1;
    ++specificity;
  }
  if (e.has_charset) {
    if (!EqualsIgnoreCase(e.charset, "utf-8")) return -1;
    ++specificity;
  }
  return specificity;
}

// The q-value a candidate gets from the most specific matching range.
struct Preference {
  int specificity = -1;
  int q = 0;
  void Offer(int s, int offered_q) {
    if (s < 0) return;
    if (s > specificity) {
      specificity = s;
      q = offered_q;
    } else if (s == specificity && offered_q > q) {
      q = offered_q;
    }
  }
};

// Whether a range names the protobuf exposition exactly (no wildcard).
bool IsProtobufRange(const Element& e) {
  return EqualsIgnoreCase(e.type, "application") &&
         EqualsIgnoreCase(e.subtype, "vnd.google.protobuf") &&
         e.proto == "io.prometheus.client.MetricFamily" &&
         e.encoding == "delimited" && !e.has_version && !e.has_charset;
}

}  // namespace

Format ChooseFormat(std::string_view accept) {
  Preference text;
  Preference open_metrics;
  int protobuf_q = 0;
  ForEachElement(accept, [&](std::string_view raw) {
    Element e;
    if (!ParseElement(raw, /*media_range=*/true, &e)) return;
    text.Offer(MatchSpecificity(e, kTextCandidate), e.q);
    open_metrics.Offer(MatchSpecificity(e, kOpenMetricsCandidate), e.q);
    if (IsProtobufRange(e) && e.q > protobuf_q) protobuf_q = e.q;
  });
  // A format no range matches keeps q = 0: not acceptable.
  if (protobuf_q > text.q && protobuf_q > open_metrics.q) {
    return Format::kProtobufDelimited;
  }
  return open_metrics.q > text.q ? Format::kOpenMetrics100 : Format::kText004;
}

std::string_view ContentType(Format format) {
  switch (format) {
    case Format::kText004:
      break;
    case Format::kOpenMetrics100:
      return kOpenMetricsContentType;
    case Format::kProtobufDelimited:
      return kProtobufContentType;
  }
  return kTextContentType;
}

bool AcceptsGzip(std::string_view accept_encoding) {
  bool seen_gzip = false;
  bool gzip_excluded = false;
  bool seen_star = false;
  bool star_excluded = false;
  ForEachElement(accept_encoding, [&](std::string_view raw) {
    Element e;
    if (!ParseElement(raw, /*media_range=*/false, &e)) return;
    if (EqualsIgnoreCase(e.type, "gzip") ||
        EqualsIgnoreCase(e.type, "x-gzip")) {
      seen_gzip = true;
      gzip_excluded = gzip_excluded || e.q == 0;
    } else if (e.type == "*") {
      seen_star = true;
      star_excluded = star_excluded || e.q == 0;
    }
  });
  if (seen_gzip) return !gzip_excluded;
  return seen_star && !star_excluded;
}

}  // namespace tokenmeter::daemon::http
