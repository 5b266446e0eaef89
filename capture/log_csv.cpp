// csvlog records for `tierlab capture log`: a fast parser for the plain
// records PostgreSQL writes nearly always and a general one for the rest.
#include "capture/log_internal.h"

#include <cassert>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tierlab::capture::logimpl {

namespace {

// The first byte in [p, end) equal to a, b or c (pass a twice for two
// bytes), or end. 16 bytes a step where SSE2 is there: most csvlog fields
// are a few bytes long, and a call to memchr per field and byte set cost
// more than the scan itself.
inline const char* find_any(const char* p, const char* end, char a, char b, char c) {
#if defined(__SSE2__)
  const __m128i va = _mm_set1_epi8(a), vb = _mm_set1_epi8(b), vc = _mm_set1_epi8(c);
  for (; end - p >= 16; p += 16) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i hit =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, va), _mm_cmpeq_epi8(x, vb)), _mm_cmpeq_epi8(x, vc));
    if (const int m = _mm_movemask_epi8(hit)) return p + __builtin_ctz(static_cast<unsigned>(m));
  }
#endif
  for (; p < end; ++p)
    if (*p == a || *p == b || *p == c) return p;
  return end;
}

// 64 bytes of a record as a bit per byte for each byte that matters to
// csv, and the bit arithmetic on them.
struct CsvBlocks {
  struct Masks {
    uint64_t comma = 0, quote = 0, nl = 0, cr = 0;
  };
  static Masks masks(const char* p) {
    Masks m;
#if defined(__SSE2__)
    const __m128i c = _mm_set1_epi8(','), q = _mm_set1_epi8('"'), n = _mm_set1_epi8('\n'), r = _mm_set1_epi8('\r');
    for (int k = 0; k < 4; ++k) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
      auto bits = [&](__m128i v) {
        return uint64_t{static_cast<uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, v)))} << (16 * k);
      };
      m.comma |= bits(c);
      m.quote |= bits(q);
      m.nl |= bits(n);
      m.cr |= bits(r);
    }
#else
    for (int k = 0; k < 64; ++k) {
      const uint64_t bit = uint64_t{1} << k;
      m.comma |= p[k] == ',' ? bit : 0;
      m.quote |= p[k] == '"' ? bit : 0;
      m.nl |= p[k] == '\n' ? bit : 0;
      m.cr |= p[k] == '\r' ? bit : 0;
    }
#endif
    return m;
  }
  // Bit i set: an odd number of quotes at or before byte i.
  static uint64_t prefix_xor(uint64_t x) {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    return x;
  }
  // The set bits of x (newlines inside quotes: few).
  static uint64_t bits(uint64_t x) {
    uint64_t c = 0;
    for (; x; x &= x - 1) ++c;
    return c;
  }
};

}  // namespace

bool parse_csv_record(std::string_view in, CsvRecord& r, char* scratch) {
  const char* const d = in.data();
  const char* const end = d + in.size();
  const char* p = d;
  char* w = scratch;
  r.fields = 0;
  r.newlines = 0;
  for (;;) {
    std::string_view field;
    if (p < end && *p == '"') {
      const char* const s = p + 1;
      // The closing quote, counting the newlines before it.
      const char* q = s;
      for (;;) {
        q = find_any(q, end, '"', '\n', '\n');
        if (q == end) return false;
        if (*q == '"') break;
        ++r.newlines;
        ++q;
      }
      if (q + 1 >= end) return false;  // "" or the end: the next byte tells
      bool copied = false;
      if (q[1] != '"') {
        field = {s, static_cast<size_t>(q - s)};
        p = q + 1;
      } else {  // doubled quotes: the field's text is unquoted into scratch
        char* const from = w;
        const char* k = s;
        for (;;) {
          std::memcpy(w, k, static_cast<size_t>(q - k));
          w += q - k;
          if (q[1] != '"') break;
          *w++ = '"';
          k = q + 2;
          for (q = k;;) {
            q = find_any(q, end, '"', '\n', '\n');
            if (q == end) return false;
            if (*q == '"') break;
            ++r.newlines;
            ++q;
          }
          if (q + 1 >= end) return false;
        }
        p = q + 1;
        field = {from, static_cast<size_t>(w - from)};
        copied = true;
      }
      if (*p != ',' && *p != '\n') {
        // Text after the closing quote belongs to the field, as it is
        // (but for a CR); a quote there is an ordinary character.
        if (!copied) {
          std::memcpy(w, field.data(), field.size());
          field = {w, field.size()};
          w += field.size();
        }
        char* const from = scratch + (field.data() - scratch);
        for (; p < end && *p != ',' && *p != '\n'; ++p)
          if (*p != '\r') *w++ = *p;
        if (p >= end) return false;
        field = {from, static_cast<size_t>(w - from)};
      }
    } else {
      const char* const s = p;
      bool cr = false;
      p = find_any(p, end, ',', '\n', '\r');
      while (p < end && *p == '\r') {
        cr = true;
        p = find_any(p + 1, end, ',', '\n', '\r');
      }
      if (p >= end) return false;
      field = {s, static_cast<size_t>(p - s)};
      if (cr) {  // CRs are dropped (CRLF line ends)
        char* const from = w;
        for (char c : field)
          if (c != '\r') *w++ = c;
        field = {from, static_cast<size_t>(w - from)};
      }
    }
    if (r.fields < CsvRecord::kMaxFields) r.f[r.fields] = field;
    ++r.fields;
    if (*p == ',') {
      ++p;
      continue;
    }
    // Invariant: *p is the record's '\n'.
    assert(*p == '\n');
    ++r.newlines;
    r.used = static_cast<size_t>(p + 1 - d);
    return true;
  }
}

bool parse_csv_plain(std::string_view in, CsvRecord& r) {
  const char* const d = in.data();
  const size_t n = in.size();
  r.fields = 0;
  r.newlines = 0;
  uint64_t inside = 0;        // all ones: the block starts inside quotes
  uint64_t after_sep = 1;     // bit 0: the block starts a field
  uint64_t closed_last = 0;   // bit 0: the last block ended in a closing quote
  size_t start = 0;           // the field's first byte
  for (size_t b = 0; b + 64 <= n; b += 64) {
    const CsvBlocks::Masks m = CsvBlocks::masks(d + b);
    const uint64_t in_quotes = CsvBlocks::prefix_xor(m.quote) ^ inside;
    inside = static_cast<uint64_t>(static_cast<int64_t>(in_quotes) >> 63);
    const uint64_t sep = (m.comma | m.nl) & ~in_quotes;
    const uint64_t ends = sep & m.nl;
    const uint64_t upto = ends ? ends ^ (ends - 1) : ~uint64_t{0};  // bits up to the record's end
    // Plain: each quote opens a field (after a separator) or closes one
    // (before a separator), and no CR is outside quotes. Else doubled
    // quotes, text outside them or CRs to drop: the general parser.
    const uint64_t opening = m.quote & in_quotes, closing = m.quote & ~in_quotes;
    const uint64_t starts = (sep << 1) | after_sep;
    const uint64_t bad = (opening & ~starts) | (((closing << 1) | closed_last) & ~sep) | (m.cr & ~in_quotes);
    if (bad & upto) return false;
    after_sep = sep >> 63;
    closed_last = closing >> 63;
    for (uint64_t s = sep & upto; s; s &= s - 1) {
      const size_t e = b + static_cast<size_t>(__builtin_ctzll(s));
      const size_t q = d[start] == '"';  // a quoted field: without its quotes
      if (r.fields < CsvRecord::kMaxFields) r.f[r.fields] = {d + start + q, e - start - 2 * q};
      ++r.fields;
      start = e + 1;
    }
    const uint64_t quoted_nl = m.nl & in_quotes & upto;
    if (quoted_nl) r.newlines += CsvBlocks::bits(quoted_nl);
    if (ends) {
      ++r.newlines;
      r.used = start;
      return true;
    }
  }
  return false;
}

}  // namespace tierlab::capture::logimpl
