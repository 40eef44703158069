// Tensor::from_url: the bytes at a URL as a uint8 tensor (tinygrad's from_url). http:// and https:// through
// cpp-httplib (https where it was built with OpenSSL, as Debian's is), file:// and plain paths from disk; gzip
// bodies inflated with zlib.
#include <httplib.h>
#include <zlib.h>

#include <fstream>
#include <iterator>

#include "tg/tensor.hpp"

namespace tg {

namespace {

[[noreturn]] void fail(const std::string& url, const std::string& why) { throw Error("[from_url] " + url + ": " + why); }

// Every gzip member of `in`, inflated and concatenated.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& url) {
  std::vector<uint8_t> out;
  size_t at = 0;
  while (at < in.size()) {
    z_stream z{};
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) fail(url, "zlib inflateInit failed");
    z.next_in = const_cast<uint8_t*>(in.data() + at);
    z.avail_in = uInt(std::min<size_t>(in.size() - at, UINT32_MAX));
    int r = Z_OK;
    uint8_t buf[1 << 16];
    while (r != Z_STREAM_END) {
      z.next_out = buf;
      z.avail_out = sizeof buf;
      r = inflate(&z, Z_NO_FLUSH);
      if (r != Z_OK && r != Z_STREAM_END) {
        inflateEnd(&z);
        fail(url, "not valid gzip data (zlib: " + std::string(z.msg ? z.msg : "error " + std::to_string(r)) + ")");
      }
      out.insert(out.end(), buf, buf + (sizeof buf - z.avail_out));
      if (r != Z_STREAM_END && z.avail_in == 0) {
        inflateEnd(&z);
        fail(url, "truncated gzip data");
      }
    }
    at += size_t(z.total_in);
    inflateEnd(&z);
  }
  return out;
}

std::vector<uint8_t> fetch(const std::string& url) {
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
  if (url.rfind("https://", 0) == 0) fail(url, "https is not supported (cpp-httplib was built without OpenSSL): fetch the file and pass its path");
#endif
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) {
    size_t slash = url.find('/', url.find("://") + 3);
    std::string host = url.substr(0, slash), path = slash == std::string::npos ? "/" : url.substr(slash);
    httplib::Client cli(host);
    cli.set_follow_location(true);
    cli.set_connection_timeout(10);
    cli.set_read_timeout(60);
    httplib::Result res = cli.Get(path);
    if (!res) fail(url, "request failed (" + httplib::to_string(res.error()) + ")");
    if (res->status != 200) fail(url, "HTTP status " + std::to_string(res->status));
    return std::vector<uint8_t>(res->body.begin(), res->body.end());
  }
  std::string path = url.rfind("file://", 0) == 0 ? url.substr(7) : url;
  if (url.find("://") != std::string::npos && url.rfind("file://", 0) != 0)
    fail(url, "unknown scheme (http://, file:// or a path are read)");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(url, "cannot open " + path);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail(url, "read error");
  return b;
}

}  // namespace

Tensor Tensor::from_url(const std::string& url, bool gz, const std::string& device) {
  std::vector<uint8_t> b = fetch(url);
  if (gz) b = gunzip(b, url);
  return from_blob(b.data(), {int64_t(b.size())}, dtypes::uint8, device);
}

}  // namespace tg
