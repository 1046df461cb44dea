// Just enough XML for S3's responses, which are flat records: find the
// elements of one name in a bounded body and decode their text. Not a
// general parser: no namespaces, CDATA or DTDs (S3 sends none), and an
// element is never searched for inside another of the same name.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace distckpt::s3 {

// Raised for bodies that are not what S3 sends (unclosed elements, unknown
// entities, too large); the client names the object and request around it.
class MalformedXml : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr size_t kMaxXmlBytes = 16 << 20;  // a ListObjectsV2 page of 1000 long keys is < 2 MiB

// The content between <name ...> and the next </name>, for each such element
// in order ("<name/>" is an empty one). Linear in the body.
std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view name);
// The first such element's content, nullopt when there is none.
std::optional<std::string_view> xml_element(std::string_view xml, std::string_view name);
// The text of the first such element with entities decoded; nullopt when absent.
std::optional<std::string> xml_text(std::string_view xml, std::string_view name);

// Decodes &amp; &lt; &gt; &quot; &apos; and numeric references (&#65; &#x41;) to UTF-8.
std::string xml_unescape(std::string_view text);
// Escapes & < > " ' for a request body (ETags carry quotes).
std::string xml_escape(std::string_view text);

}  // namespace distckpt::s3
