#include "storage/s3/xml.h"

#include <cstdint>

namespace distckpt::s3 {
namespace {

void check_size(std::string_view xml) {
  if (xml.size() > kMaxXmlBytes) {
    throw MalformedXml("an XML response of " + std::to_string(xml.size()) + " bytes (more than the " +
                       std::to_string(kMaxXmlBytes) + " accepted)");
  }
}

// Where the next "<name" that is a whole tag name starts at or after `from`,
// and where its start tag ends (after '>'); npos when there is none.
size_t find_start_tag(std::string_view xml, std::string_view name, size_t from, size_t& tag_end, bool& empty) {
  while (true) {
    const size_t at = xml.find(name, from);
    if (at == std::string_view::npos) return at;
    from = at + 1;
    if (at == 0 || xml[at - 1] != '<') continue;
    const size_t after = at + name.size();
    if (after >= xml.size()) throw MalformedXml("an unclosed <" + std::string(name) + "> tag");
    const char next = xml[after];
    if (next != '>' && next != '/' && next != ' ' && next != '\t' && next != '\r' && next != '\n') continue;
    const size_t close = xml.find('>', after);
    if (close == std::string_view::npos) throw MalformedXml("an unclosed <" + std::string(name) + "> tag");
    empty = xml[close - 1] == '/';
    tag_end = close + 1;
    return at - 1;
  }
}

void append_utf8(std::string& out, uint32_t code) {
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
  } else if (code < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (code >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (code >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
  }
}

uint32_t parse_reference(std::string_view digits, bool hex) {
  if (digits.empty() || digits.size() > 8) throw MalformedXml("a malformed character reference");
  uint32_t code = 0;
  for (char c : digits) {
    uint32_t digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint32_t>(c - '0');
    } else if (hex && c >= 'a' && c <= 'f') {
      digit = static_cast<uint32_t>(c - 'a' + 10);
    } else if (hex && c >= 'A' && c <= 'F') {
      digit = static_cast<uint32_t>(c - 'A' + 10);
    } else {
      throw MalformedXml("a malformed character reference");
    }
    code = code * (hex ? 16 : 10) + digit;
  }
  if (code == 0 || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
    throw MalformedXml("a character reference outside Unicode");
  }
  return code;
}

}  // namespace

std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view name) {
  check_size(xml);
  std::vector<std::string_view> out;
  const std::string end_tag = "</" + std::string(name) + ">";
  size_t from = 0;
  while (true) {
    size_t content_begin = 0;
    bool empty = false;
    if (find_start_tag(xml, name, from, content_begin, empty) == std::string_view::npos) return out;
    if (empty) {
      out.emplace_back();
      from = content_begin;
      continue;
    }
    const size_t content_end = xml.find(end_tag, content_begin);
    if (content_end == std::string_view::npos) throw MalformedXml("an unclosed <" + std::string(name) + "> element");
    out.push_back(xml.substr(content_begin, content_end - content_begin));
    from = content_end + end_tag.size();
  }
}

std::optional<std::string_view> xml_element(std::string_view xml, std::string_view name) {
  check_size(xml);
  size_t content_begin = 0;
  bool empty = false;
  if (find_start_tag(xml, name, 0, content_begin, empty) == std::string_view::npos) return std::nullopt;
  if (empty) return std::string_view();
  const size_t content_end = xml.find("</" + std::string(name) + ">", content_begin);
  if (content_end == std::string_view::npos) throw MalformedXml("an unclosed <" + std::string(name) + "> element");
  return xml.substr(content_begin, content_end - content_begin);
}

std::optional<std::string> xml_text(std::string_view xml, std::string_view name) {
  const auto element = xml_element(xml, name);
  if (!element) return std::nullopt;
  return xml_unescape(*element);
}

std::string xml_unescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t amp = text.find('&', i);
    out.append(text.substr(i, amp == std::string_view::npos ? std::string_view::npos : amp - i));
    if (amp == std::string_view::npos) break;
    const size_t semi = text.find(';', amp);
    if (semi == std::string_view::npos || semi - amp > 12) throw MalformedXml("an unterminated entity");
    const std::string_view entity = text.substr(amp + 1, semi - amp - 1);
    if (entity == "amp") {
      out.push_back('&');
    } else if (entity == "lt") {
      out.push_back('<');
    } else if (entity == "gt") {
      out.push_back('>');
    } else if (entity == "quot") {
      out.push_back('"');
    } else if (entity == "apos") {
      out.push_back('\'');
    } else if (entity.size() > 1 && entity[0] == '#') {
      const bool hex = entity[1] == 'x' || entity[1] == 'X';
      append_utf8(out, parse_reference(entity.substr(hex ? 2 : 1), hex));
    } else {
      throw MalformedXml("an unknown entity &" + std::string(entity) + ";");
    }
    i = semi + 1;
  }
  return out;
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace distckpt::s3
