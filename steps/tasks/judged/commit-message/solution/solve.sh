#!/bin/bash
echo "Raise ValueError for the median of an empty list instead of IndexError" > /app/commit.txt
