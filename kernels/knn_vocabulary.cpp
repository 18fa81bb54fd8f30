// knn_vocabulary.cpp -- the names of the engine's enums (knn_vocabulary.h).
#include "knn_vocabulary.h"

#include <strings.h>

#include <cctype>
#include <cstdio>

extern "C" {

const KnnName knn_metric_names[] = {
    {"l2", KNN_METRIC_L2}, {"cosine", KNN_METRIC_COSINE}, {"ip", KNN_METRIC_IP},
    {"l1", KNN_METRIC_L1}, {"hamming", KNN_METRIC_HAMMING}, {"jaccard", KNN_METRIC_JACCARD},
    {nullptr, 0}};
const KnnName knn_method_names[] = {
    {"auto", KNN_METHOD_AUTO}, {"ti", KNN_METHOD_TI}, {"brute", KNN_METHOD_BRUTE}, {nullptr, 0}};
const KnnName knn_device_names[] = {
    {"auto", KNN_DEVICE_AUTO}, {"cpu", KNN_DEVICE_CPU}, {"gpu", KNN_DEVICE_GPU}, {nullptr, 0}};
const KnnName knn_fault_names[] = {
    {"none", KNN_FAULT_NONE},           {"start", KNN_FAULT_START},
    {"run", KNN_FAULT_RUN},             {"bad_alloc", KNN_FAULT_BAD_ALLOC},
    {"finish", KNN_FAULT_FINISH},       {nullptr, 0}};

}  // extern "C"

namespace {

const char *name_of(const KnnName *table, int value) {
  for (const KnnName *n = table; n->name != nullptr; n++)
    if (n->value == value) return n->name;
  return "unknown";
}

int parse(const KnnName *table, const char *name, int *out) {
  if (name == nullptr) return 0;
  for (const KnnName *n = table; n->name != nullptr; n++)
    if (strcasecmp(n->name, name) == 0) {
      *out = n->value;
      return 1;
    }
  return 0;
}

template <class Enum>
int parse_enum(const KnnName *table, const char *name, Enum *out) {
  int value = 0;
  if (!parse(table, name, &value)) return 0;
  *out = static_cast<Enum>(value);
  return 1;
}

}  // namespace

extern "C" {

const char *knn_metric_name(KnnMetric metric) { return name_of(knn_metric_names, metric); }
const char *knn_method_name(KnnMethod method) { return name_of(knn_method_names, method); }
const char *knn_device_name(KnnDevice device) { return name_of(knn_device_names, device); }
const char *knn_fault_name(KnnFault fault) { return name_of(knn_fault_names, fault); }

const char *knn_element_name(KnnElement element) {
  switch (element) {
    case KNN_ELEMENT_FLOAT32: return "float32";
    case KNN_ELEMENT_FLOAT16: return "float16";
    case KNN_ELEMENT_BIT: return "bit";
  }
  return "unknown";
}

const char *knn_status_name(KnnStatus status) {
  switch (status) {
    case KNN_OK: return "ok";
    case KNN_CANCELLED: return "cancelled";
    case KNN_OUT_OF_MEMORY: return "out of memory";
    case KNN_INVALID_ARGUMENT: return "invalid argument";
    case KNN_DEVICE_ERROR: return "device error";
    case KNN_NO_DEVICE: return "no device";
    case KNN_INTERNAL_ERROR: return "internal error";
  }
  return "unknown";
}

int knn_metric_parse(const char *name, KnnMetric *out) {
  return parse_enum(knn_metric_names, name, out);
}
int knn_method_parse(const char *name, KnnMethod *out) {
  return parse_enum(knn_method_names, name, out);
}
int knn_device_parse(const char *name, KnnDevice *out) {
  return parse_enum(knn_device_names, name, out);
}
int knn_fault_parse(const char *name, KnnFault *out) {
  return parse_enum(knn_fault_names, name, out);
}

int knn_device_list_parse(const char *text, int32_t *devices, int32_t *n, char *errbuf,
                          size_t errlen) {
  auto fail = [&](const char *why) {
    if (errbuf != nullptr && errlen > 0) std::snprintf(errbuf, errlen, "%s", why);
    return 0;
  };
  if (text == nullptr) return fail("no GPU list");
  const char *s = text;
  while (std::isspace(static_cast<unsigned char>(*s))) s++;
  if (strncasecmp(s, "all", 3) == 0) {
    const char *rest = s + 3;
    while (std::isspace(static_cast<unsigned char>(*rest))) rest++;
    if (*rest == '\0') {
      *n = 0;
      return 1;
    }
  }
  int32_t count = 0;
  for (;;) {
    while (std::isspace(static_cast<unsigned char>(*s))) s++;
    if (!std::isdigit(static_cast<unsigned char>(*s)))
      return fail("expected \"all\" or GPU numbers separated by commas, such as \"0,1\"");
    long value = 0;
    while (std::isdigit(static_cast<unsigned char>(*s))) {
      value = value * 10 + (*s++ - '0');
      if (value > KNN_MAX_DEVICE_ORDINAL) {
        char why[64];
        std::snprintf(why, sizeof why, "a GPU number is above %d", KNN_MAX_DEVICE_ORDINAL);
        return fail(why);
      }
    }
    if (count == KNN_MAX_DEVICES) {
      char why[64];
      std::snprintf(why, sizeof why, "more than %d GPUs listed", KNN_MAX_DEVICES);
      return fail(why);
    }
    devices[count++] = static_cast<int32_t>(value);
    while (std::isspace(static_cast<unsigned char>(*s))) s++;
    if (*s == '\0') break;
    if (*s++ != ',')
      return fail("expected \"all\" or GPU numbers separated by commas, such as \"0,1\"");
  }
  *n = count;
  return 1;
}

const char *knn_metric_list(void) { return "l2, cosine, ip, l1, hamming, jaccard"; }
const char *knn_method_list(void) { return "auto, ti, brute"; }

}  // extern "C"
