// Translation unit that owns the shared precompiled header (cmake/mih_pch.h).
