/* version: the release every program reports with --version. */
#ifndef PIPER_BASE_VERSION_H
#define PIPER_BASE_VERSION_H
#define PIPER_VERSION "0.1.0"
#endif
