CREATE TABLE items (sku TEXT PRIMARY KEY, name TEXT NOT NULL, on_hand INTEGER NOT NULL,
                    reorder_level INTEGER NOT NULL);
INSERT INTO items VALUES ('SKU-1000', 'bolt M4', 143, 50);
INSERT INTO items VALUES ('SKU-1007', 'bolt M6', 115, 50);
INSERT INTO items VALUES ('SKU-1014', 'nut M4', 150, 100);
INSERT INTO items VALUES ('SKU-1021', 'nut M6', 47, 20);
INSERT INTO items VALUES ('SKU-1028', 'washer 4mm', 121, 100);
INSERT INTO items VALUES ('SKU-1035', 'washer 6mm', 157, 100);
INSERT INTO items VALUES ('SKU-1042', 'hinge small', 24, 20);
INSERT INTO items VALUES ('SKU-1049', 'hinge large', 77, 50);
INSERT INTO items VALUES ('SKU-1056', 'bracket L', 23, 20);
INSERT INTO items VALUES ('SKU-1063', 'bracket T', 10, 100);
INSERT INTO items VALUES ('SKU-1070', 'spring 10mm', 101, 100);
INSERT INTO items VALUES ('SKU-1077', 'spring 20mm', 157, 50);
INSERT INTO items VALUES ('SKU-1084', 'rivet 3mm', 40, 100);
INSERT INTO items VALUES ('SKU-1091', 'rivet 5mm', 3, 100);
INSERT INTO items VALUES ('SKU-1098', 'clip A', 16, 100);
INSERT INTO items VALUES ('SKU-1105', 'clip B', 9, 20);
INSERT INTO items VALUES ('SKU-1112', 'gasket 8mm', 50, 50);
