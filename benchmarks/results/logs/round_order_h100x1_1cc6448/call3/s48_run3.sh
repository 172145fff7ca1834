#!/usr/bin/env bash
# Session 48, call 3 (an H200): call 2 on the other GPU kind: the tile probe twice and
# epilogue_ab.py in order and reversed, the rounds in a balanced Latin square.
exec bash tmp_device/s48_run2.sh
